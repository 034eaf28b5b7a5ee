//! Random operation sequences on a `WorkQueue`, mirrored into a plain model and compared step by
//! step, on paused time. Some sequences shut the queue down midway (plainly or with drain) and
//! go on: the model then follows client-go's shutdown (queued items are still handed out).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use durable_informer::queue::{ItemExponentialFailureRateLimiter, WorkQueue};
use futures::FutureExt;
use proptest::prelude::*;

/// Items are drawn from a small set so that collisions (dedup, re-adds) are frequent.
const ITEMS: u8 = 4;
const MAX_BACKOFF_MS: u64 = 8;

#[derive(Debug, Clone)]
enum Op {
    Add(u8),
    AddAfter(u8, u8),
    AddRateLimited(u8),
    Get,
    /// Done for the n-th processing item (modulo their number).
    Done(usize),
    Forget(u8),
    Advance(u8),
}

/// How a sequence shuts the queue down, before its n-th op.
#[derive(Debug, Clone, Copy)]
enum Shutdown {
    Plain(usize),
    /// Also polls `shutdown_with_drain` after every later op.
    Drain(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let item = 0..ITEMS;
    prop_oneof![
        3 => item.clone().prop_map(Op::Add),
        2 => (item.clone(), 0..20_u8).prop_map(|(item, ms)| Op::AddAfter(item, ms)),
        1 => item.clone().prop_map(Op::AddRateLimited),
        3 => Just(Op::Get),
        3 => any::<usize>().prop_map(Op::Done),
        1 => item.prop_map(Op::Forget),
        2 => (0..10_u8).prop_map(Op::Advance),
    ]
}

/// The specification: client-go's queue written as naively as possible, time in milliseconds.
#[derive(Debug, Default)]
struct Model {
    now: u64,
    queue: VecDeque<u8>,
    dirty: HashSet<u8>,
    processing: Vec<u8>,
    /// (deadline, arrival) → item.
    waiting: BTreeMap<(u64, u64), u8>,
    arrivals: u64,
    failures: HashMap<u8, u32>,
    shutting_down: bool,
}

impl Model {
    fn add(&mut self, item: u8) {
        if self.shutting_down {
            return;
        }
        if self.dirty.insert(item) && !self.processing.contains(&item) {
            self.queue.push_back(item);
        }
    }

    fn add_after(&mut self, item: u8, ms: u64) {
        if self.shutting_down {
            return;
        }
        if ms == 0 {
            return self.add(item);
        }
        let deadline = self.now + ms;
        let existing = self
            .waiting
            .iter()
            .find(|(_, waiting)| **waiting == item)
            .map(|(key, _)| *key);
        if let Some(key) = existing {
            if key.0 <= deadline {
                return;
            }
            self.waiting.remove(&key);
        }
        self.arrivals += 1;
        self.waiting.insert((deadline, self.arrivals), item);
    }

    fn promote(&mut self) {
        while let Some(entry) = self.waiting.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let item = entry.remove();
            self.add(item);
        }
    }

    fn shutdown(&mut self) {
        self.shutting_down = true;
        self.waiting.clear();
    }

    /// Whether a drain would return now: nothing is processing.
    fn drained(&self) -> bool {
        self.processing.is_empty()
    }

    /// Client-go: queued items come out even after a shutdown; `None` only means "nothing
    /// queued" (the caller checks the shutdown).
    fn get(&mut self) -> Option<u8> {
        let item = self.queue.pop_front()?;
        self.dirty.remove(&item);
        self.processing.push(item);
        Some(item)
    }

    fn done(&mut self, item: u8) {
        self.processing.retain(|processing| *processing != item);
        if self.dirty.contains(&item) {
            self.queue.push_back(item);
        }
    }

    fn add_rate_limited(&mut self, item: u8) {
        // After a shutdown the rate limiter is not consulted: no failure is counted.
        if !self.shutting_down {
            let ms = self.backoff(item);
            self.add_after(item, ms);
        }
    }

    fn backoff(&mut self, item: u8) -> u64 {
        let failures = self.failures.entry(item).or_default();
        let ms = (1_u64 << (*failures).min(10)).min(MAX_BACKOFF_MS);
        *failures += 1;
        ms
    }
}

fn check(ops: Vec<Op>, shutdown: Option<Shutdown>) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(async move {
        let queue: WorkQueue<u8> = WorkQueue::builder()
            .rate_limiter(ItemExponentialFailureRateLimiter::new(
                Duration::from_millis(1),
                Duration::from_millis(MAX_BACKOFF_MS),
            ))
            .build();
        let mut model = Model::default();
        for (step, op) in ops.into_iter().enumerate() {
            model.promote();
            match shutdown {
                Some(Shutdown::Plain(at)) if at == step => {
                    queue.shutdown();
                    model.shutdown();
                }
                Some(Shutdown::Drain(at)) if at == step => {
                    let returned = queue.shutdown_with_drain().now_or_never().is_some();
                    model.shutdown();
                    prop_assert_eq!(returned, model.drained(), "step {}: drain", step);
                }
                _ => {}
            }
            match op {
                Op::Add(item) => {
                    queue.add(item);
                    model.add(item);
                }
                Op::AddAfter(item, ms) => {
                    queue.add_after(item, Duration::from_millis(ms.into()));
                    model.add_after(item, ms.into());
                }
                Op::AddRateLimited(item) => {
                    queue.add_rate_limited(item);
                    model.add_rate_limited(item);
                }
                Op::Get => {
                    // None: would wait; Some(None): shut down; Some(Some(item)).
                    let got = queue.get().now_or_never();
                    if let Some(Some(item)) = got {
                        prop_assert!(
                            !model.processing.contains(&item),
                            "step {step}: {item} handed out while processing"
                        );
                    }
                    let expected = match model.get() {
                        Some(item) => Some(Some(item)),
                        None => model.shutting_down.then_some(None),
                    };
                    prop_assert_eq!(got, expected, "step {}: get", step);
                }
                Op::Done(n) => {
                    if !model.processing.is_empty() {
                        let item = model.processing[n % model.processing.len()];
                        queue.done(&item);
                        model.done(item);
                    }
                }
                Op::Forget(item) => {
                    queue.forget(&item);
                    model.failures.remove(&item);
                    prop_assert_eq!(queue.num_requeues(&item), 0);
                }
                Op::Advance(ms) => {
                    tokio::time::advance(Duration::from_millis(ms.into())).await;
                    model.now += u64::from(ms);
                }
            }
            model.promote();
            let metrics = queue.metrics();
            prop_assert_eq!(metrics.depth, model.queue.len(), "step {}: depth", step);
            let distinct: HashSet<_> = model.queue.iter().collect();
            prop_assert_eq!(distinct.len(), model.queue.len(), "model holds duplicates");
            prop_assert_eq!(metrics.processing, model.processing.len());
            prop_assert_eq!(metrics.waiting, model.waiting.len());
            prop_assert_eq!(queue.is_shutting_down(), model.shutting_down);
            if model.shutting_down && matches!(shutdown, Some(Shutdown::Drain(_))) {
                let returned = queue.shutdown_with_drain().now_or_never().is_some();
                prop_assert_eq!(returned, model.drained(), "step {}: drain", step);
            }
            for item in 0..ITEMS {
                let failures = model.failures.get(&item).copied().unwrap_or(0);
                prop_assert_eq!(queue.num_requeues(&item), failures);
            }
        }

        // Nothing is lost: finish everything in flight, let every delay pass, and every item that
        // was added since it was last handed out comes out, exactly once.
        for item in std::mem::take(&mut model.processing) {
            queue.done(&item);
            model.done(item);
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        model.now += 1000;
        model.promote();
        let mut expected: Vec<_> = model.queue.iter().copied().collect();
        let mut delivered = Vec::new();
        while let Some(item) = queue.get().now_or_never().flatten() {
            delivered.push(item);
            queue.done(&item);
        }
        prop_assert_eq!(&delivered, &expected);
        expected.sort_unstable();
        expected.dedup();
        prop_assert_eq!(expected.len(), delivered.len());
        if model.shutting_down {
            prop_assert!(queue.shutdown_with_drain().now_or_never().is_some(), "drained");
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn queue_matches_the_model(
        ops in proptest::collection::vec(op(), 1..120),
        shutdown in prop_oneof![
            2 => Just(None),
            1 => (0..120_usize).prop_map(|at| Some(Shutdown::Plain(at))),
            1 => (0..120_usize).prop_map(|at| Some(Shutdown::Drain(at))),
        ],
    ) {
        check(ops, shutdown)?;
    }
}
