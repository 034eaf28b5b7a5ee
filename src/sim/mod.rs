//! The simulated Kubernetes API server.
