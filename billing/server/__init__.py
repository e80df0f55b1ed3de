"""The running service: the FastAPI app that puts the API's routers and the console together,
its middleware and background work (``app``), and the ASGI app ``billing serve`` runs
(``asgi``)."""
