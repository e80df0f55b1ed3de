"""HTTP API: thin FastAPI handlers over the domain modules."""
