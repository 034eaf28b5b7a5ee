//! The durable store.
