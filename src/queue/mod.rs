//! Rate-limited workqueue with client-go semantics.
