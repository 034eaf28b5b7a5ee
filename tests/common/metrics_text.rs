//! Reading the crate's Prometheus text exposition back in tests.
#![allow(dead_code)] // not every test binary reads metrics

use std::time::Duration;

/// The value of the sample `name` whose labels include every `labels` pair.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        let matches = n == name && labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
        matches.then(|| value.parse().ok()).flatten()
    })
}

pub async fn eventually(what: &str, mut ok: impl FnMut(&str) -> bool) {
    for _ in 0..500 {
        if ok(&durable_informer::metrics::encode()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what} never held:\n{}", durable_informer::metrics::encode());
}
