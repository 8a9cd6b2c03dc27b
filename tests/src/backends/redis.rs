//! Fixtures for the Redis and Valkey backends (filled in with the Redis store).
