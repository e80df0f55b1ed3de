"""The package list, which pyproject.toml cannot state: the ``billing*`` packages found in the
tree plus ``billing._migrations`` (the top-level ``migrations/``, mapped by ``package-dir`` in
pyproject.toml), so that a wheel carries the Alembic scripts ``billing migrate`` runs."""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["billing*"]),
        "billing._migrations",
        "billing._migrations.versions",
    ]
)
