"""Storage: ORM tables, column types and database engines."""
