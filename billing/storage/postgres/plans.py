"""Keys and plans on PostgreSQL (``billing.plans.repository.PlansRepository``): the statements are
written alike for both databases (``billing.storage.plans_core``)."""

from __future__ import annotations

from billing.storage.plans_core import CorePlans


class PostgresPlans(CorePlans):
    """``PlansRepository`` on PostgreSQL."""


#: This room's repository in the store (``billing.storage.store``).
REPOSITORY = PostgresPlans()
