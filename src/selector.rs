//! Label and field selectors with the API server's syntax (shared by the simulated server and listers).
