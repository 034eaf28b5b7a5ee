//! Label and field selector parsing (selectors come from users and from URLs the sim serves).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(sel) = durable_informer::selector::LabelSelector::parse(s) {
        let labels = std::collections::BTreeMap::from([("a".to_owned(), "b".to_owned())]);
        let _ = sel.matches(&labels);
    }
    if let Ok(sel) = durable_informer::selector::FieldSelector::parse(s) {
        let _ = sel.matches(|f| (f == "metadata.name").then(|| "x".to_owned()));
    }
});
