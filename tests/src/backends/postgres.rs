//! Fixtures for the PostgreSQL backend (filled in with the PostgreSQL store).
