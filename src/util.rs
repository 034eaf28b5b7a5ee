//! Crate-private helpers every module needs the same way: poisoned locks and panic payloads.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks that take the data of a poisoned lock as it is: every lock in the crate guards state
/// that each holder leaves consistent between statements, so a panic elsewhere does not make
/// it unusable, and must not spread to every later caller.
pub(crate) trait Locked<T: ?Sized> {
    /// The guard.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`Locked`] for an `RwLock`.
pub(crate) trait RwLocked<T: ?Sized> {
    /// A read guard.
    fn reading(&self) -> RwLockReadGuard<'_, T>;
    /// A write guard.
    fn writing(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLocked<T> for RwLock<T> {
    fn reading(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }
    fn writing(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The message of a panic's payload (`panic!` with a literal or a formatted string).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic with a payload that is not a message".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_messages_are_read_from_both_payload_kinds() {
        let literal = std::panic::catch_unwind(|| panic!("literal")).unwrap_err();
        let formatted = std::panic::catch_unwind(|| panic!("{}", 42)).unwrap_err();
        let other = std::panic::catch_unwind(|| std::panic::panic_any(7u8)).unwrap_err();
        assert_eq!(panic_message(&*literal), "literal");
        assert_eq!(panic_message(&*formatted), "42");
        assert!(panic_message(&*other).contains("not a message"));
    }

    #[test]
    fn a_poisoned_lock_is_still_usable() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison");
        })
        .join();
        assert!(m.is_poisoned());
        *m.locked() += 1;
        assert_eq!(*m.locked(), 2);
    }
}
