//! The exposition's shape across informers and queues: one series per label set, names that
//! do not carry paths, series removed with their handler. A binary of its own: the registry is
//! process-wide, and `informer_metrics` counts exact values.

mod common;

use std::sync::Arc;

use common::fake::Fake;
use common::metrics_text::{eventually, sample};
use durable_informer::controller::{Action, Controller};
use durable_informer::informer::{async_handler_fn, Event, HandlerOptions, Informer};
use durable_informer::store::{DurableStore, StoreConfig};
use k8s_openapi::api::core::v1::ConfigMap;

/// Every series of the exposition: (name, sorted labels) → how often it appears.
fn series(text: &str) -> std::collections::BTreeMap<String, usize> {
    let mut seen = std::collections::BTreeMap::new();
    for l in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (s, _) = l.rsplit_once(' ').unwrap_or((l, ""));
        *seen.entry(s.to_owned()).or_insert(0) += 1;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unnamed_handlers_same_named_queues_and_database_names_give_valid_distinct_series() {
    let fake = Fake::new();
    fake.upsert("a", "1");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("named.redb");
    let db = DurableStore::open(StoreConfig::new(&path)).unwrap();
    let inf = Informer::<ConfigMap>::builder(&db, fake.clone()).build().await.unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    // Two unnamed handlers, both stuck: each has a lag series of its own.
    let regs: Vec<_> = (0..2)
        .map(|_| {
            let g = gate.clone();
            inf.add_event_handler(
                async_handler_fn(move |_: Event<ConfigMap>| {
                    let g = g.clone();
                    async move {
                        g.acquire().await.map(|p| p.forget()).ok();
                        Ok::<(), std::convert::Infallible>(())
                    }
                }),
                HandlerOptions::default(),
            )
        })
        .collect();
    inf.start();
    inf.wait_for_sync().await.expect("cache synced");
    eventually("two unnamed handlers have two lag series", |t| {
        t.lines()
            .filter(|l| l.starts_with("durable_informer_handler_lag_entries{") && l.contains("handler=\"volatile-"))
            .count()
            >= 2
    })
    .await;

    // Two queues of one name (two controllers left unnamed alike): one series per name.
    let q1 = durable_informer::queue::WorkQueue::<String>::builder()
        .name("twin")
        .build();
    let q2 = durable_informer::queue::WorkQueue::<String>::builder()
        .name("twin")
        .build();
    q1.add("x".to_owned());
    q2.add("y".to_owned());
    q2.add("z".to_owned());
    let text = durable_informer::metrics::encode();
    let twin = [("name", "twin"), ("controller", "twin")];
    assert_eq!(sample(&text, "workqueue_adds_total", &twin), Some(3.0), "{text}");
    assert_eq!(sample(&text, "workqueue_depth", &twin), Some(3.0), "{text}");

    // The database is named by its file, not its directory.
    eventually("database_bytes is labelled with the file's name", |t| {
        sample(t, "durable_informer_database_bytes", &[("database", "named.redb")]).is_some()
    })
    .await;
    let text = durable_informer::metrics::encode();
    assert!(!text.contains(&dir.path().display().to_string()), "{text}");
    let dupes: Vec<_> = series(&text).into_iter().filter(|(_, n)| *n > 1).collect();
    assert!(dupes.is_empty(), "duplicate series {dupes:?}\n{text}");

    // A handler that is gone leaves no series.
    gate.add_permits(1000);
    for r in regs {
        r.remove().await;
    }
    inf.shutdown().await.unwrap();
    eventually("stopped handlers' lag series are removed", |t| {
        !t.contains("handler=\"volatile-")
    })
    .await;
}

/// Parses a Prometheus text exposition strictly: `# HELP` and `# TYPE` once per family, before
/// its samples; every sample of a declared family (its name, or the name with the suffix its
/// type allows), its samples together, label values quoted with valid escapes, values
/// numbers; no series twice. Returns the problems found.
fn strict_problems(text: &str) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut problems = Vec::new();
    let mut help = BTreeSet::new();
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut series = BTreeSet::new();
    let mut finished = BTreeSet::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if line == "# EOF" || line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default().to_owned();
            if !help.insert(name.clone()) {
                problems.push(format!("HELP twice for {name}"));
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            let (name, ty) = (it.next().unwrap_or_default(), it.next().unwrap_or_default());
            if !["counter", "gauge", "histogram", "summary", "info", "unknown"].contains(&ty) {
                problems.push(format!("{name}: unknown type {ty:?}"));
            }
            if types.insert(name.to_owned(), ty.to_owned()).is_some() {
                problems.push(format!("TYPE twice for {name}"));
            }
            if let Some(prev) = current.replace(name.to_owned()) {
                finished.insert(prev);
            }
            continue;
        }
        if line.starts_with('#') {
            problems.push(format!("stray comment {line:?}"));
            continue;
        }
        let (series_part, value) = match line.rsplit_once(' ') {
            Some(p) => p,
            None => {
                problems.push(format!("no value: {line:?}"));
                continue;
            }
        };
        if value.parse::<f64>().is_err() && !["+Inf", "-Inf", "NaN"].contains(&value) {
            problems.push(format!("bad value in {line:?}"));
        }
        let (name, labels) = match series_part.split_once('{') {
            Some((n, l)) => match l.strip_suffix('}') {
                Some(l) => (n, l),
                None => {
                    problems.push(format!("unclosed labels in {line:?}"));
                    continue;
                }
            },
            None => (series_part, ""),
        };
        // Labels: name="value" pairs, values with only \\, \" and \n escapes.
        let mut pairs = Vec::new();
        let mut rest = labels;
        while !rest.is_empty() {
            let Some((k, after)) = rest.split_once("=\"") else {
                problems.push(format!("bad labels in {line:?}"));
                break;
            };
            let mut value = String::new();
            let mut chars = after.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some((_, e @ ('\\' | '"' | 'n'))) => value.push(e),
                        _ => problems.push(format!("bad escape in {line:?}")),
                    },
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    c => value.push(c),
                }
            }
            let Some(end) = end else {
                problems.push(format!("unterminated label value in {line:?}"));
                break;
            };
            pairs.push((k.to_owned(), value));
            rest = after[end + 1..].strip_prefix(',').unwrap_or(&after[end + 1..]);
        }
        let keys: BTreeSet<&String> = pairs.iter().map(|(k, _)| k).collect();
        if keys.len() != pairs.len() {
            problems.push(format!("a label twice in {line:?}"));
        }
        pairs.sort();
        let family = types
            .iter()
            .filter(|(f, ty)| {
                let suffixes: &[&str] = match ty.as_str() {
                    "counter" => &["_total", "_created"],
                    "histogram" => &["_bucket", "_sum", "_count", "_created"],
                    "summary" => &["", "_sum", "_count", "_created"],
                    "info" => &["_info"],
                    _ => &[""],
                };
                suffixes.iter().any(|s| name == format!("{f}{s}"))
            })
            .map(|(f, _)| f.clone())
            .next();
        match family {
            None => problems.push(format!("sample of no declared family: {line:?}")),
            Some(f) if finished.contains(&f) || current.as_deref() != Some(f.as_str()) => {
                problems.push(format!("{f}'s samples are not together: {line:?}"));
            }
            Some(_) => {}
        }
        if !series.insert((name.to_owned(), pairs)) {
            problems.push(format!("duplicate series {series_part}"));
        }
    }
    for f in types.keys() {
        if !help.contains(f) {
            problems.push(format!("no HELP for {f}"));
        }
    }
    problems
}

#[test]
fn the_strict_parser_finds_what_promtool_would() {
    let ok = "# HELP a A.\n# TYPE a counter\na_total{x=\"1\"} 1\n# HELP g G.\n# TYPE g gauge\ng 2\n# EOF\n";
    assert_eq!(strict_problems(ok), Vec::<String>::new());
    let twice = "# HELP g G.\n# TYPE g gauge\ng{x=\"1\"} 1\ng{x=\"1\"} 2\n";
    assert_eq!(strict_problems(twice).len(), 1, "{:?}", strict_problems(twice));
    let type_twice = "# HELP g G.\n# TYPE g gauge\ng 1\n# TYPE g gauge\n";
    assert!(!strict_problems(type_twice).is_empty());
    let undeclared = "# HELP g G.\n# TYPE g gauge\nh 1\n";
    assert!(!strict_problems(undeclared).is_empty());
    let bad_escape = "# HELP g G.\n# TYPE g gauge\ng{x=\"a\\q\"} 1\n";
    assert!(!strict_problems(bad_escape).is_empty());
}

/// A reconcile that panics on `boom` and takes a little time on the others.
async fn reconcile(cm: Arc<ConfigMap>, _: Arc<()>) -> Result<Action, std::convert::Infallible> {
    assert!(cm.metadata.name.as_deref() != Some("boom"), "a reconcile that panics");
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    Ok(Action::await_change())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_unnamed_controllers_and_three_unnamed_handlers_give_a_valid_exposition() {
    use futures::StreamExt;
    let fakes = [Fake::new(), Fake::new()];
    for f in &fakes {
        f.upsert("a", "1");
        f.upsert("boom", "1");
    }
    let dir = tempfile::tempdir().unwrap();
    let mut stops = Vec::new();
    let mut tasks = Vec::new();
    let mut dbs = Vec::new();
    let mut handlers = Vec::new();
    for (i, fake) in fakes.iter().enumerate() {
        let db = DurableStore::open(StoreConfig::new(dir.path().join(format!("c{i}.redb")))).unwrap();
        let inf = Informer::<ConfigMap>::builder(&db, fake.clone()).build().await.unwrap();
        // Three unnamed handlers in all: two on the first informer, one on the second.
        for _ in 0..(2 - i) {
            handlers.push(inf.add_event_handler(
                async_handler_fn(|_: Event<ConfigMap>| async { Ok::<(), std::convert::Infallible>(()) }),
                HandlerOptions::default(),
            ));
        }
        // Unnamed: both take the resource's name.
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stream = Controller::for_informer(inf)
            .graceful_shutdown_on(async move {
                let _ = stopped.await;
            })
            .run(reconcile, |_, _, _| Action::await_change(), Arc::new(()));
        tasks.push(tokio::spawn(stream.for_each(|_| async {})));
        stops.push(stop);
        dbs.push(db);
    }
    eventually("both controllers reconciled and saw the panic", |t| {
        sample(t, "durable_informer_reconcile_panics_total", &[]).is_some_and(|v| v >= 2.0)
            && sample(t, "durable_informer_reconcile_total", &[("result", "success")]).is_some_and(|v| v >= 2.0)
    })
    .await;
    let text = durable_informer::metrics::encode();
    let problems = strict_problems(&text);
    assert!(problems.is_empty(), "{problems:#?}\n{text}");
    assert!(text.contains("# TYPE durable_informer_active_workers gauge"), "{text}");
    assert!(
        text.lines()
            .filter(|l| l.starts_with("durable_informer_handler_lag_entries{") && l.contains("handler=\"volatile-"))
            .count()
            >= 3,
        "{text}"
    );
    for s in stops {
        let _ = s.send(());
    }
    for t in tasks {
        tokio::time::timeout(std::time::Duration::from_secs(10), t)
            .await
            .expect("the controllers stop")
            .unwrap();
    }
    // Every reconcile over, no worker counts as busy.
    let text = durable_informer::metrics::encode();
    for l in text
        .lines()
        .filter(|l| l.starts_with("durable_informer_active_workers{"))
    {
        assert!(l.ends_with(" 0"), "{l}");
    }
    drop(handlers);
}
