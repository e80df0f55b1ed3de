"""What every handler needs from the running app: settings, engine, sessions, metrics."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from billing.metrics import Metrics
from billing.settings import Settings


@dataclass
class AppState:
    """Per-app resources, created by ``create_app`` and disposed at shutdown."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    metrics: Metrics


def get_state(request: Request) -> AppState:
    """FastAPI dependency: the app's ``AppState``."""
    state: AppState = request.app.state.billing
    return state
