"""The render queue: a crash-safe SQLite ledger (storage), the queue API, workers and executor backends."""
