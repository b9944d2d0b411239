"""Real engines beyond SQLite: throwaway servers (``servers``, ``postgres``) and PostgreSQL behind
labkit's database seam (``postgres_db``, ``pg_protect``). Nothing here is imported until used."""
