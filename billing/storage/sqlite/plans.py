"""Keys and plans on SQLite (``billing.plans.repository.PlansRepository``): the statements are
written alike for both databases (``billing.storage.plans_core``)."""

from __future__ import annotations

from billing.storage.plans_core import CorePlans


class SqlitePlans(CorePlans):
    """``PlansRepository`` on SQLite."""


#: This room's repository in the store (``billing.storage.store``).
REPOSITORY = SqlitePlans()
