"""The ASGI app that ``billing serve`` runs: settings from the environment, background passes on."""

from billing.api.app import create_app

app = create_app(background=True)
