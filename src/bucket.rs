//! The global retry-token bucket with fair per-tenant shares, and its tower layer (in progress).
