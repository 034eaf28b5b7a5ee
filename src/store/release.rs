//! The files this process's stores hold, so that opening a file that an earlier store of this
//! process is still letting go of waits for it instead of failing with `Locked`.
//!
//! A store's file stays open for a moment after its last handle is gone: its writer commits what
//! was queued (on a thread of its own when the last handle went on an async task, which must
//! not block on it) and reads in flight finish. A restart within the process (a test, an
//! application that rebuilds its informers) opens the file again at once; it waits for that
//! release, at most [`WAIT`], but never for a store that is still open.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long an open waits for a closing store of this process to let go of the file.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// Set once a store is closing: its file is about to be released.
#[derive(Debug, Default)]
pub(crate) struct Closing(AtomicBool);

impl Closing {
    pub(crate) fn set(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Every file held, with the closing mark of each store that holds it.
#[derive(Default)]
struct Files {
    held: Mutex<HashMap<PathBuf, Vec<Arc<Closing>>>>,
    released: Condvar,
}

fn files() -> &'static Files {
    static FILES: OnceLock<Files> = OnceLock::new();
    FILES.get_or_init(Files::default)
}

fn held() -> MutexGuard<'static, HashMap<PathBuf, Vec<Arc<Closing>>>> {
    // Nothing panics while holding it: a poisoned lock still holds a consistent map.
    files().held.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One file, however it is named.
fn key(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned())
}

/// Registered while a backend holds a file; dropped once the file is closed.
#[derive(Debug)]
pub(crate) struct HeldFile {
    path: PathBuf,
    closing: Arc<Closing>,
}

impl HeldFile {
    pub(crate) fn new(path: &Path, closing: Arc<Closing>) -> Self {
        let path = key(path);
        held().entry(path.clone()).or_default().push(closing.clone());
        Self { path, closing }
    }
}

impl Drop for HeldFile {
    fn drop(&mut self) {
        let mut held = held();
        if let Some(stores) = held.get_mut(&self.path) {
            if let Some(i) = stores.iter().position(|c| Arc::ptr_eq(c, &self.closing)) {
                stores.swap_remove(i);
            }
            if stores.is_empty() {
                held.remove(&self.path);
            }
        }
        drop(held);
        files().released.notify_all();
    }
}

/// After an open found `path` locked: waits (at most `timeout`) while only closing stores of
/// this process hold it. True when an open is worth trying again (nothing here holds it now);
/// false when an open store of this process holds it, or it was not released in time.
pub(crate) fn wait_released(path: &Path, timeout: Duration) -> bool {
    let path = key(path);
    let deadline = Instant::now() + timeout;
    let mut held = held();
    loop {
        match held.get(&path) {
            None => return true,
            Some(stores) if stores.iter().any(|c| !c.is_set()) => return false,
            Some(_) => {
                let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                    return false;
                };
                held = files()
                    .released
                    .wait_timeout(held, left)
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0;
            }
        }
    }
}
