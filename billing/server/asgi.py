"""The ASGI app that ``billing serve`` runs: settings from the environment, background passes on."""

from billing.server.app import create_app

app = create_app(background=True)
