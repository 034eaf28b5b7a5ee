//! Shard Leases: each shard holds a Lease named after itself (through the leader module's
//! elector), and the sharder judges from what it observes which shards are alive.
//!
//! States are decided as the leader module decides expiry: by when the sharder last saw the
//! Lease change, on its own monotonic clock, never by the `renewTime` the shard wrote (clock
//! skew). With `d` the Lease's duration and `t` the time since the sharder last saw it change:
//!
//! | state | when | in the ring |
//! |---|---|---|
//! | ready | held by the shard itself, `t < d` | yes |
//! | expired | held by the shard, `d ≤ t < 2d` | yes (it may be a hiccup) |
//! | uncertain | held by the shard, `t ≥ 2d`: the sharder takes the Lease | yes, until taken |
//! | dead | released (no holder) or held by someone else (the sharder) | no: its objects move at once |
//! | orphaned | dead for a further minute: the sharder deletes the Lease | no |

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::leader::{KubeLeaseLock, LeaderElectionConfig, LeaderElector, LeaseRecord};
use crate::selector::{RingMember, CONTROLLER_RING_LABEL};

/// The identity the sharder writes when it takes the Lease of a shard that stopped renewing
/// (timebertt's, so either sharder recognises the other's fencing).
///
/// ```
/// assert_eq!(durable_informer::sharding::SHARDER_IDENTITY, "shardlease-controller");
/// ```
pub const SHARDER_IDENTITY: &str = "shardlease-controller";

/// How long a dead shard's Lease is kept before the sharder deletes it (timebertt's minute).
///
/// ```
/// assert_eq!(durable_informer::sharding::ORPHAN_AFTER.as_secs(), 60);
/// ```
pub const ORPHAN_AFTER: Duration = Duration::from_secs(60);

/// The term assumed for a Lease that states none (timebertt's default).
const DEFAULT_TERM: Duration = Duration::from_secs(15);

/// The Lease of shard `member` in `namespace`, held through a [`LeaderElector`]: the shard
/// "leads" its own Lease (name and holder are its id, labelled with its ring), renews it every
/// `retry_period` and, with `release_on_cancel`, releases it when stopped, so the sharder moves
/// its objects at once instead of after two lease durations.
///
/// Pass its [`fenced_leadership`](LeaderElector::fenced_leadership) to
/// [`Controller::leader_election`](crate::controller::Controller::leader_election): the shard
/// then reconciles only while it holds its Lease, and stops before the sharder may declare it
/// dead and hand its objects to others.
///
/// ```no_run
/// # async fn f(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use durable_informer::leader::LeaderElectionConfig;
/// use durable_informer::selector::RingLabels;
/// use durable_informer::sharding::shard_lease;
///
/// let me = RingLabels::new("web")?.member("web-7d9f")?;
/// let lease = shard_lease(client, "default", &me, LeaderElectionConfig::default());
/// let holding = lease.fenced_leadership();
/// let (stop_tx, stop) = tokio::sync::watch::channel(false);
/// let task = tokio::spawn(lease.run(stop));
/// // … run the shard's controller with `holding` …
/// stop_tx.send(true)?; // releases the Lease
/// task.await??;
/// # let _ = holding; Ok(()) }
/// ```
#[must_use]
pub fn shard_lease(
    client: kube::Client,
    namespace: &str,
    member: &RingMember,
    config: LeaderElectionConfig,
) -> LeaderElector<KubeLeaseLock> {
    let lock = KubeLeaseLock::new(client, namespace, member.shard(), member.shard())
        .label(CONTROLLER_RING_LABEL, member.ring().ring());
    LeaderElector::new(lock, config)
}

/// What the sharder concluded about a shard from its Lease. Ordered from gone to alive.
///
/// ```
/// use durable_informer::sharding::ShardState;
/// assert!(ShardState::Expired.is_available() && !ShardState::Dead.is_available());
/// assert!(ShardState::Ready > ShardState::Uncertain);
/// assert_eq!(ShardState::Uncertain.to_string(), "uncertain");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ShardState {
    /// Dead for over [`ORPHAN_AFTER`]: the Lease is to be deleted.
    Orphaned,
    /// Released, or taken by the sharder: the shard is out of the ring.
    Dead,
    /// Not renewed for two lease durations: the sharder takes the Lease to fence the shard.
    Uncertain,
    /// Not renewed for one lease duration: still in the ring (it may come back).
    Expired,
    /// Held and renewed.
    Ready,
}

impl ShardState {
    /// Whether the shard is on the ring (ready, expired or uncertain): objects stay on it,
    /// and move away from it only through the drain handshake.
    #[must_use]
    pub fn is_available(self) -> bool {
        self >= ShardState::Uncertain
    }

    /// The state's name, as timebertt's sharder writes it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ShardState::Orphaned => "orphaned",
            ShardState::Dead => "dead",
            ShardState::Uncertain => "uncertain",
            ShardState::Expired => "expired",
            ShardState::Ready => "ready",
        }
    }
}

impl std::fmt::Display for ShardState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone)]
struct Seen {
    record: LeaseRecord,
    at: Instant,
}

/// The shard Leases of a ring as the sharder observed them, with the moment each last changed
/// on the sharder's clock.
///
/// ```
/// use std::time::Duration;
/// use durable_informer::leader::LeaseRecord;
/// use durable_informer::sharding::{ShardLeases, ShardState};
/// use tokio::time::Instant;
///
/// let mut leases = ShardLeases::default();
/// let t0 = Instant::now();
/// leases.observe("shard-a", LeaseRecord::held_by("shard-a", Duration::from_secs(10), 0), t0);
/// assert_eq!(leases.state("shard-a", t0), Some(ShardState::Ready));
/// assert_eq!(leases.state("shard-a", t0 + Duration::from_secs(10)), Some(ShardState::Expired));
/// assert_eq!(leases.state("shard-a", t0 + Duration::from_secs(20)), Some(ShardState::Uncertain));
/// assert_eq!(leases.available(t0), vec!["shard-a".to_owned()]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ShardLeases {
    seen: BTreeMap<String, Seen>,
}

impl ShardLeases {
    /// Records the Lease `name` as read at `now`. Its clock restarts only when the record
    /// changed (a renewal changes `renewTime`), as the leader module's expiry does.
    pub fn observe(&mut self, name: &str, record: LeaseRecord, now: Instant) {
        match self.seen.get_mut(name) {
            Some(s) if s.record.same_content(&record) => s.record = record,
            _ => {
                self.seen.insert(name.to_owned(), Seen { record, at: now });
            }
        }
    }

    /// Forgets a deleted Lease.
    pub fn forget(&mut self, name: &str) {
        self.seen.remove(name);
    }

    /// The last record seen of Lease `name`.
    #[must_use]
    pub fn record(&self, name: &str) -> Option<&LeaseRecord> {
        self.seen.get(name).map(|s| &s.record)
    }

    /// The state of shard `name` at `now` (`None`: no such Lease).
    #[must_use]
    pub fn state(&self, name: &str, now: Instant) -> Option<ShardState> {
        let s = self.seen.get(name)?;
        let term = term(&s.record);
        let silent = now.saturating_duration_since(s.at);
        let held_by_itself = s.record.holder.as_deref() == Some(name);
        Some(if !held_by_itself {
            if silent >= term + ORPHAN_AFTER {
                ShardState::Orphaned
            } else {
                ShardState::Dead
            }
        } else if silent < term {
            ShardState::Ready
        } else if silent < term * 2 {
            ShardState::Expired
        } else {
            ShardState::Uncertain
        })
    }

    /// Every shard's state at `now`.
    #[must_use]
    pub fn states(&self, now: Instant) -> BTreeMap<String, ShardState> {
        self.seen
            .keys()
            .filter_map(|n| Some((n.clone(), self.state(n, now)?)))
            .collect()
    }

    /// The shards on the ring at `now` (sorted).
    #[must_use]
    pub fn available(&self, now: Instant) -> Vec<String> {
        self.states(now)
            .into_iter()
            .filter(|(_, s)| s.is_available())
            .map(|(n, _)| n)
            .collect()
    }

    /// The next moment after `now` at which some shard's state changes by the passing of time.
    #[must_use]
    pub fn next_change(&self, now: Instant) -> Option<Instant> {
        self.seen
            .iter()
            .flat_map(|(name, s)| {
                let term = term(&s.record);
                let points: Vec<Duration> = if s.record.holder.as_deref() == Some(name.as_str()) {
                    vec![term, term * 2]
                } else {
                    vec![term + ORPHAN_AFTER]
                };
                points.into_iter().map(move |d| s.at + d)
            })
            .filter(|t| *t > now)
            .min()
    }
}

/// The Lease's duration (whole seconds on the wire); a Lease stating none counts as 15 s.
fn term(record: &LeaseRecord) -> Duration {
    if record.lease_duration.is_zero() {
        DEFAULT_TERM
    } else {
        record.lease_duration
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(by: &str) -> LeaseRecord {
        let mut r = LeaseRecord::held_by(by, Duration::from_secs(10), 0);
        r.resource_version = Some("1".into());
        r
    }

    #[tokio::test(start_paused = true)]
    async fn a_shard_that_stops_renewing_goes_ready_expired_uncertain_then_dead_when_taken() {
        let mut l = ShardLeases::default();
        l.observe("a", held("a"), Instant::now());
        let s = |l: &ShardLeases| l.state("a", Instant::now()).unwrap();
        assert_eq!(s(&l), ShardState::Ready);
        assert_eq!(
            l.next_change(Instant::now()),
            Some(Instant::now() + Duration::from_secs(10))
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(s(&l), ShardState::Expired);
        assert!(s(&l).is_available());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(s(&l), ShardState::Uncertain);
        // The sharder takes it: dead at once, orphaned a minute after its term.
        let mut taken = held(SHARDER_IDENTITY);
        taken.lease_duration = Duration::from_secs(20);
        l.observe("a", taken, Instant::now());
        assert_eq!(s(&l), ShardState::Dead);
        assert!(l.available(Instant::now()).is_empty());
        tokio::time::advance(Duration::from_secs(80)).await;
        assert_eq!(s(&l), ShardState::Orphaned);
    }

    #[tokio::test(start_paused = true)]
    async fn expiry_runs_from_the_last_change_seen_not_from_the_written_renew_time() {
        let mut l = ShardLeases::default();
        // A shard whose clock is an hour behind: its renewTime says it expired long ago.
        let mut r = held("a");
        r.renew_time = r.renew_time.map(|t| t - std::time::Duration::from_secs(3600));
        l.observe("a", r.clone(), Instant::now());
        assert_eq!(l.state("a", Instant::now()), Some(ShardState::Ready));
        tokio::time::advance(Duration::from_secs(9)).await;
        // The same record read again does not restart the clock; a renewal does.
        l.observe("a", r.clone(), Instant::now());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(l.state("a", Instant::now()), Some(ShardState::Expired));
        l.observe("a", r.renewed(), Instant::now());
        assert_eq!(l.state("a", Instant::now()), Some(ShardState::Ready));
    }

    #[test]
    fn a_released_lease_is_dead_at_once_and_a_missing_one_unknown() {
        let mut l = ShardLeases::default();
        let now = Instant::now();
        l.observe("a", held("a").released(), now);
        assert_eq!(l.state("a", now), Some(ShardState::Dead));
        assert_eq!(l.state("b", now), None);
        l.forget("a");
        assert!(l.states(now).is_empty());
    }
}
