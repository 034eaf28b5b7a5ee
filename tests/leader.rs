//! Leader election on paused (virtual) time against an in-memory Lease, as client-go's
//! leaderelection tests do: acquire, renew, no takeover of a live Lease, takeover after it
//! expired, loss when renewals fail, release on stop, and expiry judged by this replica's
//! own observation (a holder with a skewed clock keeps its Lease while it renews).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use durable_informer::leader::{LeaderElectionConfig, LeaderElector, LeaderError, LeaseLock, LeaseRecord};
use tokio::sync::watch;

/// One Lease shared by every replica's lock, with a resourceVersion and switchable failures.
#[derive(Default)]
struct Server {
    lease: Option<LeaseRecord>,
    rv: u64,
    /// Writes by this identity fail (a partitioned replica).
    failing: Option<String>,
    writes: u64,
    /// When the Lease was last written (virtual time).
    last_write: Option<tokio::time::Instant>,
    /// The resourceVersion as it changes, for locks that watch the Lease.
    versions: Option<watch::Sender<u64>>,
}

impl Server {
    /// Writes `record` as the Lease's next version.
    fn store(&mut self, record: &LeaseRecord) -> LeaseRecord {
        self.rv += 1;
        self.writes += 1;
        self.last_write = Some(tokio::time::Instant::now());
        let mut r = record.clone();
        r.resource_version = Some(self.rv.to_string());
        self.lease = Some(r.clone());
        if let Some(v) = &self.versions {
            v.send_replace(self.rv);
        }
        r
    }

    fn watchable() -> Arc<Mutex<Server>> {
        let (versions, _) = watch::channel(0);
        Arc::new(Mutex::new(Server {
            versions: Some(versions),
            ..Server::default()
        }))
    }
}

#[derive(Clone)]
struct FakeLock {
    server: Arc<Mutex<Server>>,
    identity: String,
}

impl FakeLock {
    fn new(server: &Arc<Mutex<Server>>, identity: &str) -> Self {
        Self {
            server: server.clone(),
            identity: identity.to_owned(),
        }
    }

    fn fail(&self) -> Result<(), LeaderError> {
        if self.server.lock().unwrap().failing.as_deref() == Some(self.identity.as_str()) {
            return Err(LeaderError::Conflict {
                lease: "test/lease".into(),
            });
        }
        Ok(())
    }
}

impl LeaseLock for FakeLock {
    async fn get(&self) -> Result<Option<LeaseRecord>, LeaderError> {
        self.fail()?;
        Ok(self.server.lock().unwrap().lease.clone())
    }

    async fn create(&self, record: &LeaseRecord) -> Result<LeaseRecord, LeaderError> {
        self.fail()?;
        let mut s = self.server.lock().unwrap();
        if s.lease.is_some() {
            return Err(LeaderError::AlreadyExists {
                lease: "test/lease".into(),
            });
        }
        Ok(s.store(record))
    }

    async fn update(&self, record: &LeaseRecord) -> Result<LeaseRecord, LeaderError> {
        self.fail()?;
        let mut s = self.server.lock().unwrap();
        let current = s.lease.as_ref().and_then(|l| l.resource_version.clone());
        if current != record.resource_version {
            return Err(LeaderError::Conflict {
                lease: "test/lease".into(),
            });
        }
        Ok(s.store(record))
    }

    async fn changed(&self, resource_version: Option<String>) {
        let versions = self
            .server
            .lock()
            .unwrap()
            .versions
            .as_ref()
            .map(watch::Sender::subscribe);
        let Some(mut versions) = versions else {
            return std::future::pending().await;
        };
        let seen = resource_version.and_then(|v| v.parse::<u64>().ok());
        let _ = versions.wait_for(|v| Some(*v) != seen).await;
    }

    fn identity(&self) -> &str {
        &self.identity
    }

    fn describe(&self) -> String {
        "test/lease".into()
    }
}

fn config() -> LeaderElectionConfig {
    LeaderElectionConfig::default()
}

/// An elector running in a task, with its leadership and stop switch.
struct Replica {
    leading: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), LeaderError>>,
}

fn replica(server: &Arc<Mutex<Server>>, identity: &str, config: LeaderElectionConfig) -> Replica {
    let elector = LeaderElector::new(FakeLock::new(server, identity), config);
    let leading = elector.leadership();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(elector.run(rx));
    Replica { leading, stop, task }
}

fn holder(server: &Arc<Mutex<Server>>) -> Option<String> {
    server.lock().unwrap().lease.as_ref().and_then(|l| l.holder.clone())
}

async fn advance(d: Duration) {
    // Small steps, so every timer due in between fires in order.
    let step = Duration::from_millis(100);
    let mut left = d;
    while !left.is_zero() {
        let s = step.min(left);
        tokio::time::advance(s).await;
        tokio::task::yield_now().await;
        left -= s;
    }
}

#[tokio::test(start_paused = true)]
async fn the_first_replica_creates_the_lease_and_leads() {
    let server = Arc::new(Mutex::new(Server::default()));
    let a = replica(&server, "a", config());
    advance(Duration::from_millis(100)).await;
    assert!(*a.leading.borrow());
    assert_eq!(holder(&server).as_deref(), Some("a"));
    let lease = server.lock().unwrap().lease.clone().unwrap();
    assert_eq!(lease.lease_duration, Duration::from_secs(15));
    assert_eq!(lease.transitions, 0);
}

#[tokio::test(start_paused = true)]
async fn a_renewed_lease_is_never_taken_and_the_leader_renews_every_retry_period() {
    let server = Arc::new(Mutex::new(Server::default()));
    let a = replica(&server, "a", config());
    advance(Duration::from_millis(100)).await;
    let b = replica(&server, "b", config());
    let writes_before = server.lock().unwrap().writes;
    advance(Duration::from_secs(60)).await;
    assert!(*a.leading.borrow());
    assert!(!*b.leading.borrow(), "b never leads while a renews");
    assert_eq!(holder(&server).as_deref(), Some("a"));
    let renewals = server.lock().unwrap().writes - writes_before;
    assert!((25..=31).contains(&renewals), "one renewal per 2 s: {renewals}");
}

#[tokio::test(start_paused = true)]
async fn a_lease_that_stops_changing_is_taken_after_lease_duration_and_not_before() {
    let server = Arc::new(Mutex::new(Server::default()));
    // Someone (a crashed replica) holds it, with a renew time far in the future: a skewed clock.
    server.lock().unwrap().lease = Some(LeaseRecord {
        renew_time: Some(k8s_openapi::jiff::Timestamp::now() + Duration::from_secs(3600)),
        resource_version: Some("7".into()),
        ..LeaseRecord::held_by("crashed", Duration::from_secs(15), 3)
    });
    let b = replica(&server, "b", config());
    // b first sees the record now; it expires 15 s after that, whatever renewTime says.
    advance(Duration::from_secs(14)).await;
    assert!(
        !*b.leading.borrow(),
        "not before lease_duration since b saw it last change"
    );
    advance(Duration::from_secs(6)).await;
    assert!(*b.leading.borrow());
    let lease = server.lock().unwrap().lease.clone().unwrap();
    assert_eq!(lease.holder.as_deref(), Some("b"));
    assert_eq!(lease.transitions, 4, "a change of holder counts a transition");
}

#[tokio::test(start_paused = true)]
async fn a_holder_whose_clock_is_behind_keeps_its_lease_while_it_renews() {
    let server = Arc::new(Mutex::new(Server::default()));
    let b = replica(&server, "b", config());
    // The holder writes renew times an hour in the past (its clock), but keeps renewing.
    for i in 0..40u64 {
        {
            let mut s = server.lock().unwrap();
            s.rv += 1;
            let rv = s.rv.to_string();
            s.lease = Some(LeaseRecord {
                renew_time: Some(k8s_openapi::jiff::Timestamp::now() - Duration::from_secs(3600 + i)),
                resource_version: Some(rv),
                ..LeaseRecord::held_by("skewed", Duration::from_secs(15), 0)
            });
        }
        advance(Duration::from_secs(2)).await;
        assert!(!*b.leading.borrow(), "round {i}: a renewing holder is never displaced");
    }
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_cannot_renew_steps_down_before_the_others_may_take_over() {
    let server = Arc::new(Mutex::new(Server::default()));
    let a = replica(&server, "a", config());
    advance(Duration::from_millis(100)).await;
    let b = replica(&server, "b", config());
    advance(Duration::from_secs(3)).await;
    assert!(*a.leading.borrow());
    // a is cut off: its reads and writes fail from now on.
    server.lock().unwrap().failing = Some("a".into());
    let cut_at = tokio::time::Instant::now();
    let renewed_at = server.lock().unwrap().last_write.expect("a renewed");
    let mut a_lost_at = None;
    let mut b_won_at = None;
    for tenth in 0..300u32 {
        advance(Duration::from_millis(100)).await;
        if a_lost_at.is_none() && !*a.leading.borrow() {
            a_lost_at = Some(tenth);
        }
        if b_won_at.is_none() && *b.leading.borrow() {
            b_won_at = Some(tenth);
        }
        assert!(!(*a.leading.borrow() && *b.leading.borrow()), "two leaders at {tenth}");
    }
    let (lost, won) = (a_lost_at.expect("a stepped down"), b_won_at.expect("b took over"));
    assert!(lost <= 100, "a steps down within renew_deadline: {lost}");
    assert!(won > lost, "b leads only after a stepped down ({lost} < {won})");
    // b's win lies in (won, won + 1] tenths after the cut, and a's last renewal before it.
    let after_renewal = Duration::from_millis(100 * (u64::from(won) + 1)) + (cut_at - renewed_at);
    assert!(
        after_renewal >= config().lease_duration,
        "b waits a whole lease_duration after the last renewal: {after_renewal:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn stopping_releases_the_lease_and_another_replica_takes_it_at_once() {
    let server = Arc::new(Mutex::new(Server::default()));
    let a = replica(&server, "a", config());
    advance(Duration::from_millis(100)).await;
    let b = replica(&server, "b", config());
    advance(Duration::from_secs(1)).await;
    a.stop.send(true).unwrap();
    advance(Duration::from_millis(100)).await;
    a.task.await.unwrap().unwrap();
    assert!(!*a.leading.borrow());
    assert_eq!(holder(&server), None, "released: no holder");
    // b sees an unheld Lease at its next try (within the jittered retry period), not 15 s later.
    advance(Duration::from_millis(4500)).await;
    assert!(*b.leading.borrow());
    assert_eq!(holder(&server).as_deref(), Some("b"));
}

#[tokio::test(start_paused = true)]
async fn two_replicas_racing_for_a_free_lease_never_both_win() {
    let server = Arc::new(Mutex::new(Server::default()));
    let replicas: Vec<Replica> = (0..5).map(|i| replica(&server, &format!("r{i}"), config())).collect();
    for _ in 0..200 {
        advance(Duration::from_millis(100)).await;
        let leaders = replicas.iter().filter(|r| *r.leading.borrow()).count();
        assert!(leaders <= 1, "{leaders} leaders");
    }
    assert_eq!(replicas.iter().filter(|r| *r.leading.borrow()).count(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_unsafe_configuration_is_refused() {
    let server = Arc::new(Mutex::new(Server::default()));
    let bad = LeaderElectionConfig {
        renew_deadline: Duration::from_secs(20),
        ..config()
    };
    let r = replica(&server, "a", bad);
    let err = r.task.await.unwrap().unwrap_err();
    assert!(matches!(err, LeaderError::Config { .. }), "{err}");
    assert!(!*r.leading.borrow());
}

/// A long retry period, so that a takeover at its next poll would be seconds late.
fn slow_polls() -> LeaderElectionConfig {
    LeaderElectionConfig {
        lease_duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(9),
        release_on_cancel: true,
    }
}

#[tokio::test(start_paused = true)]
async fn a_follower_takes_an_expired_lease_when_it_expires_not_at_its_next_poll() {
    let server = Arc::new(Mutex::new(Server::default()));
    server.lock().unwrap().lease = Some(LeaseRecord {
        resource_version: Some("7".into()),
        ..LeaseRecord::held_by("crashed", Duration::from_secs(15), 0)
    });
    let b = replica(&server, "b", slow_polls());
    advance(Duration::from_millis(14_900)).await;
    assert!(!*b.leading.borrow(), "not before the term ends");
    // Polls every 9 to 19.8 s would next look at 18 s or later.
    advance(Duration::from_millis(300)).await;
    assert!(*b.leading.borrow(), "taken when it expired");
}

#[tokio::test(start_paused = true)]
async fn a_follower_watching_the_lease_takes_a_released_one_at_once() {
    let server = Server::watchable();
    let a = replica(&server, "a", slow_polls());
    advance(Duration::from_millis(100)).await;
    assert!(*a.leading.borrow());
    let b = replica(&server, "b", slow_polls());
    advance(Duration::from_secs(20)).await;
    assert!(!*b.leading.borrow(), "a renews: b follows");
    a.stop.send(true).unwrap();
    a.task.await.unwrap().unwrap();
    // Released, and taken as soon as b's watch saw it (no virtual time has passed, or 100 ms).
    advance(Duration::from_millis(100)).await;
    assert!(*b.leading.borrow(), "the release was seen through the watch");
    assert_eq!(holder(&server).as_deref(), Some("b"));
}

#[tokio::test(start_paused = true)]
async fn the_fenced_leadership_follows_the_flag_and_each_renewal() {
    let server = Arc::new(Mutex::new(Server::default()));
    let elector = LeaderElector::new(FakeLock::new(&server, "a"), config());
    let fenced = elector.fenced_leadership();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(elector.run(rx));
    assert!(!fenced.is_leading());
    advance(Duration::from_millis(100)).await;
    assert!(fenced.is_leading());
    // Renewals keep extending the term well past one renew deadline.
    advance(Duration::from_secs(30)).await;
    assert!(fenced.is_leading());
    // Renewals fail: the term ends with the deadline, and the flag goes off with it.
    server.lock().unwrap().failing = Some("a".into());
    advance(Duration::from_secs(11)).await;
    assert!(!fenced.is_leading());
    assert!(!*fenced.flag().borrow());
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();
}
