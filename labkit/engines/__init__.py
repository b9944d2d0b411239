"""Real engines beyond SQLite (PostgreSQL, Redis, etcd): reserved for the issues that bring them."""
