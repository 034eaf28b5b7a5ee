//! Leader election over a `coordination.k8s.io/v1` Lease, with client-go's semantics.
//!
//! One replica holds the Lease and renews it every `retry_period`; the others try to take it
//! every `retry_period` (and at once when a watch on the Lease shows a change, or when the
//! holder's term runs out) and succeed only once the holder stopped renewing for a whole
//! `lease_duration`. Every write is an update conditioned on the Lease's resourceVersion, so two
//! replicas can never both win one round: the loser gets a conflict.
//!
//! Expiry is judged as client-go judges it: by when *this* replica last saw the Lease record
//! change, on its own monotonic clock, never by the `renewTime` written by the holder (whose
//! clock may be skewed). A leader that cannot renew for `renew_deadline` (shorter than
//! `lease_duration`) gives leadership up before anyone else may take it.
//!
//! ```no_run
//! use durable_informer::leader::{KubeLeaseLock, LeaderElectionConfig, LeaderElector};
//! # async fn f(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let lock = KubeLeaseLock::new(client, "default", "my-controller", "replica-a");
//! let elector = LeaderElector::new(lock, LeaderElectionConfig::default());
//! let mut leading = elector.leadership();
//! let (stop_tx, stop) = tokio::sync::watch::channel(false);
//! tokio::spawn(elector.run(stop));
//! leading.wait_for(|l| *l).await?;
//! println!("leading");
//! stop_tx.send(true)?; // releases the Lease (release_on_cancel)
//! # Ok(()) }
//! ```

mod kube_lock;
mod metrics;
mod record;

use std::future::Future;
use std::time::Duration;

use rand::Rng;
use tokio::sync::watch;
use tokio::time::Instant;

pub use kube_lock::KubeLeaseLock;
pub use record::LeaseRecord;

/// Timings and behaviour of an elector. `Default` gives client-go's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    /// How long a Lease that is not renewed stays valid for the others (default 15 s).
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives leadership up (default
    /// 10 s). Must be shorter than `lease_duration`.
    pub renew_deadline: Duration,
    /// How often every replica tries to acquire or renew (default 2 s).
    pub retry_period: Duration,
    /// Give the Lease up when stopped, so another replica takes over at once instead of
    /// after `lease_duration` (default true).
    pub release_on_cancel: bool,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            release_on_cancel: true,
        }
    }
}

/// Errors of a Lease lock.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaderError {
    /// The Lease changed since it was read (someone else wrote it).
    #[error("lease {lease}: changed since it was read (conflict)")]
    Conflict {
        /// `namespace/name`.
        lease: String,
    },
    /// The Lease was created by someone else in the meantime.
    #[error("lease {lease}: already exists")]
    AlreadyExists {
        /// `namespace/name`.
        lease: String,
    },
    /// The API server refused or failed the request.
    #[error("lease {lease}: {source}")]
    Api {
        /// `namespace/name`.
        lease: String,
        /// What the client said.
        #[source]
        source: kube::Error,
    },
    /// The configuration cannot be safe.
    #[error("renew_deadline ({renew_deadline:?}) must be shorter than lease_duration ({lease_duration:?}), and retry_period shorter than renew_deadline")]
    Config {
        /// The configured renew deadline.
        renew_deadline: Duration,
        /// The configured lease duration.
        lease_duration: Duration,
    },
}

/// Where a Lease is kept: read, create, and update conditioned on the resourceVersion read.
/// [`KubeLeaseLock`] is the one for a real (or simulated) API server; tests use their own.
pub trait LeaseLock: Send + Sync + 'static {
    /// The Lease, or `None` when it does not exist.
    fn get(&self) -> impl Future<Output = Result<Option<LeaseRecord>, LeaderError>> + Send;
    /// Creates the Lease; [`LeaderError::AlreadyExists`] when someone else did first.
    fn create(&self, record: &LeaseRecord) -> impl Future<Output = Result<LeaseRecord, LeaderError>> + Send;
    /// Replaces the Lease if its resourceVersion is still `record.resource_version`;
    /// [`LeaderError::Conflict`] otherwise.
    fn update(&self, record: &LeaseRecord) -> impl Future<Output = Result<LeaseRecord, LeaderError>> + Send;
    /// Resolves when the Lease may have changed since `resource_version` (a watch on it), so a
    /// follower sees a release or a renewal at once instead of at its next poll. The default
    /// never resolves: the elector then polls every `retry_period`, as client-go does.
    fn changed(&self, resource_version: Option<String>) -> impl Future<Output = ()> + Send {
        let _ = resource_version;
        std::future::pending()
    }
    /// This replica's identity (the `holderIdentity` it writes).
    fn identity(&self) -> &str;
    /// `namespace/name`, for logs.
    fn describe(&self) -> String;
}

/// The last record this replica saw and when it first saw it (its own monotonic clock).
struct Observed {
    record: LeaseRecord,
    at: Instant,
}

/// Runs leader election for one replica.
pub struct LeaderElector<L> {
    lock: L,
    config: LeaderElectionConfig,
    leading: watch::Sender<bool>,
    /// Until when the current term is vouched for: the start of the last successful
    /// acquire/renew round plus `renew_deadline` (None when not leading).
    until: watch::Sender<Option<Instant>>,
    observed: Option<Observed>,
}

/// Whether this replica leads, checked against the clock: [`is_leading`](Self::is_leading)
/// is true only while the flag is on *and* the last renewal is younger than `renew_deadline`.
///
/// The flag alone turns false when the elector task runs; a process that was paused (SIGSTOP,
/// a long GC-like stall, a starved runtime) resumes with the flag still on while another
/// replica may already hold the Lease. The deadline, on the monotonic clock that keeps running
/// through a pause, closes that gap: the controller checks it before each reconcile, and a
/// reconcile can check it before it writes.
///
/// ```
/// use durable_informer::leader::Leadership;
/// let (tx, rx) = tokio::sync::watch::channel(true);
/// // From a plain flag (no deadline): leading while the flag is on.
/// let l = Leadership::from(rx);
/// assert!(l.is_leading());
/// tx.send_replace(false);
/// assert!(!l.is_leading());
/// ```
#[derive(Debug, Clone)]
pub struct Leadership {
    flag: watch::Receiver<bool>,
    until: Option<watch::Receiver<Option<Instant>>>,
}

impl Leadership {
    /// Leadership from a flag and the end of the current term (`None`: not vouched for), for
    /// an election mechanism of your own.
    #[must_use]
    pub fn new(flag: watch::Receiver<bool>, until: watch::Receiver<Option<Instant>>) -> Self {
        Self {
            flag,
            until: Some(until),
        }
    }

    /// Leading now: the flag is on and the term has not run out on this replica's clock.
    #[must_use]
    pub fn is_leading(&self) -> bool {
        *self.flag.borrow()
            && self
                .until
                .as_ref()
                .is_none_or(|u| u.borrow().is_some_and(|t| Instant::now() < t))
    }

    /// The flag alone, as it changes.
    #[must_use]
    pub fn flag(&self) -> watch::Receiver<bool> {
        self.flag.clone()
    }
}

impl From<watch::Receiver<bool>> for Leadership {
    fn from(flag: watch::Receiver<bool>) -> Self {
        Self { flag, until: None }
    }
}

impl<L: LeaseLock> LeaderElector<L> {
    /// An elector over `lock`; nothing happens until [`run`](Self::run).
    #[must_use]
    pub fn new(lock: L, config: LeaderElectionConfig) -> Self {
        let (leading, _) = watch::channel(false);
        let (until, _) = watch::channel(None);
        Self {
            lock,
            config,
            leading,
            until,
            observed: None,
        }
    }

    /// Leadership with its deadline (see [`Leadership`]): what
    /// [`Controller::leader_election`](crate::controller::Controller::leader_election) wants.
    #[must_use]
    pub fn fenced_leadership(&self) -> Leadership {
        Leadership {
            flag: self.leading.subscribe(),
            until: Some(self.until.subscribe()),
        }
    }

    /// The end of the term started by the last successful round.
    fn vouch(&self) {
        let until = self.observed.as_ref().map(|o| o.at + self.config.renew_deadline);
        self.until.send_replace(until);
    }

    /// Whether this replica leads, now and as it changes. It turns false *before* the Lease
    /// can be taken by another replica (after `renew_deadline` without a renewal) and before
    /// the Lease is released on stop, so work guarded by it stops in time.
    #[must_use]
    pub fn leadership(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    /// Acquires, renews, and after a loss tries again, until `stop` turns true (or is
    /// dropped); then stops leading and, with `release_on_cancel`, releases the Lease.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> Result<(), LeaderError> {
        let c = self.config;
        if c.renew_deadline >= c.lease_duration || c.retry_period >= c.renew_deadline {
            return Err(LeaderError::Config {
                renew_deadline: c.renew_deadline,
                lease_duration: c.lease_duration,
            });
        }
        let lease = self.lock.describe();
        metrics::following(&lease);
        loop {
            if !self.acquire(&mut stop).await {
                break;
            }
            tracing::info!(lease = %self.lock.describe(), identity = self.lock.identity(), "became leader");
            self.vouch();
            self.leading.send_replace(true);
            metrics::set_leading(&lease, true);
            let stopped = self.renew(&mut stop).await;
            // Leadership ends here, before the Lease is released or can expire for the others.
            self.leading.send_replace(false);
            self.until.send_replace(None);
            metrics::set_leading(&lease, false);
            if stopped {
                if c.release_on_cancel {
                    self.release().await;
                }
                break;
            }
            tracing::warn!(lease = %self.lock.describe(), identity = self.lock.identity(), "leadership lost");
        }
        Ok(())
    }

    /// One round of [`run`](Self::run)'s loop at a moment the caller picks: acquire or renew,
    /// then lead as `run` would (from a successful round on; no longer once the last success
    /// is `renew_deadline` old). The controller test harness runs a leader and a standby this
    /// way, on its virtual clock and its own schedule (no jitter). Returns whether it leads.
    #[cfg(feature = "testing")]
    pub(crate) async fn round(&mut self) -> bool {
        if self.try_acquire_or_renew().await {
            self.vouch();
            self.leading.send_replace(true);
        } else if self.until.borrow().is_none_or(|t| Instant::now() >= t) {
            self.leading.send_replace(false);
            self.until.send_replace(None);
        }
        *self.leading.borrow()
    }

    /// Tries every `retry_period` (jittered) until it holds the Lease; false when stopped.
    async fn acquire(&mut self, stop: &mut watch::Receiver<bool>) -> bool {
        loop {
            if *stop.borrow() {
                return false;
            }
            if self.try_acquire_or_renew().await {
                return true;
            }
            // client-go's jitter: up to 1.2 × the period on top, so replicas do not move in step.
            let jitter = rand::rng().random_range(0.0..1.2);
            let mut wake = Instant::now() + self.config.retry_period.mul_f64(1.0 + jitter);
            // Try again the moment the holder's term runs out, not up to a period later.
            if let Some(o) = &self.observed {
                if o.record.holder.is_some() {
                    let expiry = o.at + self.term_of(&o.record) + Duration::from_millis(1);
                    // Never spin: a zero-length lease that keeps conflicting waits 10 ms.
                    wake = wake.min(expiry.max(Instant::now() + Duration::from_millis(10)));
                }
            }
            let rv = self.observed.as_ref().and_then(|o| o.record.resource_version.clone());
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {}
                // A release or a renewal: read it now (a release is taken at once).
                () = self.lock.changed(rv) => {}
                _ = stop.wait_for(|s| *s) => return false,
            }
        }
    }

    /// Renews every `retry_period` while leading; returns true when stopped, false when a
    /// renewal did not succeed for `renew_deadline`.
    async fn renew(&mut self, stop: &mut watch::Receiver<bool>) -> bool {
        let mut last_renewal = Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.config.retry_period) => {}
                _ = stop.wait_for(|s| *s) => return true,
            }
            if *stop.borrow() {
                return true;
            }
            // The renewal may itself hang: it counts against the deadline too.
            let deadline = last_renewal + self.config.renew_deadline;
            match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                Ok(true) => {
                    last_renewal = Instant::now();
                    self.vouch();
                }
                Ok(false) | Err(_) if Instant::now() >= deadline => return false,
                Ok(false) | Err(_) => {}
            }
        }
    }

    /// One round: read the Lease, and take or renew it if it is ours or has expired.
    async fn try_acquire_or_renew(&mut self) -> bool {
        let me = self.lock.identity().to_owned();
        let now = Instant::now();
        let current = match self.lock.get().await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(lease = %self.lock.describe(), error = %e, "reading the lease failed");
                return false;
            }
        };
        let Some(current) = current else {
            let record = LeaseRecord::held_by(&me, self.config.lease_duration, 0);
            return match self.lock.create(&record).await {
                Ok(created) => {
                    self.observe(created, now);
                    true
                }
                Err(e) => {
                    tracing::debug!(lease = %self.lock.describe(), error = %e, "creating the lease failed");
                    false
                }
            };
        };
        // A record that changed since last seen restarts its expiry clock.
        let changed = self.observed.as_ref().is_none_or(|o| !o.record.same_content(&current));
        if changed {
            self.observe(current.clone(), now);
        }
        let held_by_other = current.holder.as_deref().is_some_and(|h| !h.is_empty() && h != me);
        if held_by_other {
            let seen_at = self.observed.as_ref().map_or(now, |o| o.at);
            if seen_at + self.term_of(&current) > now {
                return false;
            }
        }
        let mut next = if current.holder.as_deref() == Some(me.as_str()) {
            current.renewed()
        } else {
            LeaseRecord::held_by(&me, self.config.lease_duration, current.transitions + 1)
        };
        next.lease_duration = self.config.lease_duration;
        next.resource_version.clone_from(&current.resource_version);
        match self.lock.update(&next).await {
            Ok(written) => {
                self.observe(written, now);
                true
            }
            Err(e) => {
                tracing::debug!(lease = %self.lock.describe(), error = %e, "updating the lease failed");
                false
            }
        }
    }

    /// How long a holder's silence must last before the Lease may be taken: the record's
    /// duration (whole seconds on the wire), never less than this replica's own setting.
    fn term_of(&self, record: &LeaseRecord) -> Duration {
        record.lease_duration.max(self.config.lease_duration)
    }

    fn observe(&mut self, record: LeaseRecord, at: Instant) {
        self.observed = Some(Observed { record, at });
    }

    /// Gives the Lease up (if still ours): empty holder, so the next replica takes it at once.
    async fn release(&mut self) {
        let Ok(Some(current)) = self.lock.get().await else {
            return;
        };
        if current.holder.as_deref() != Some(self.lock.identity()) {
            return;
        }
        let mut released = current.released();
        released.resource_version.clone_from(&current.resource_version);
        match self.lock.update(&released).await {
            Ok(_) => tracing::info!(lease = %self.lock.describe(), "lease released"),
            Err(e) => tracing::warn!(lease = %self.lock.describe(), error = %e, "releasing the lease failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn leadership_ends_with_its_term_even_while_the_flag_is_still_on() {
        let (flag_tx, flag) = watch::channel(true);
        let (until_tx, until) = watch::channel(Some(Instant::now() + Duration::from_secs(1)));
        let l = Leadership::new(flag, until);
        assert!(l.is_leading());
        // A pause: the clock moves on, nobody has turned the flag off yet.
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert!(*l.flag().borrow());
        assert!(!l.is_leading(), "the term ran out");
        // A renewal extends it; the flag going off ends it.
        until_tx.send_replace(Some(Instant::now() + Duration::from_secs(1)));
        assert!(l.is_leading());
        flag_tx.send_replace(false);
        assert!(!l.is_leading());
        // No term at all: not leading.
        flag_tx.send_replace(true);
        until_tx.send_replace(None);
        assert!(!l.is_leading());
    }
}
