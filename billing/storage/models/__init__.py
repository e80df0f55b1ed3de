"""All ORM tables of the service, one module per concern (the migrations are the source of the
schema); every table is importable from here, and importing this package registers them all on
``Base.metadata``."""

from billing.storage.models.archive import MonthArchive, ParkedCall
from billing.storage.models.auth import ApiToken
from billing.storage.models.base import (
    AFTER_TOKENS,
    Base,
    EntryPlanRates,
    EntryRates,
    PriceRates,
    TokenColumns,
    row_dict,
)
from billing.storage.models.budgets import (
    Budget,
    BudgetAlert,
    BudgetGeneration,
    BudgetHold,
    BudgetOpenCall,
    BudgetSpend,
    WebhookOutbox,
)
from billing.storage.models.calls import Call, CallAttempt, Event
from billing.storage.models.credits import CreditEntry, CreditGrant, CreditOverdraft, Customer
from billing.storage.models.ledger import LedgerEntry, Price
from billing.storage.models.plans import KeyAssignment, PlanPrice, PlanVersion
from billing.storage.models.providers import ProviderReportLine, ProviderReportVersion
from billing.storage.models.rollups import (
    CallStatusRollup,
    DriftRollup,
    UsageRollup,
    UsageRollupAllKeys,
    UsageRollupByCustomer,
    UsageRollupByKey,
    UsageRollupKeyless,
)

__all__ = [
    "AFTER_TOKENS",
    "ApiToken",
    "Base",
    "Budget",
    "BudgetAlert",
    "BudgetGeneration",
    "BudgetHold",
    "BudgetOpenCall",
    "BudgetSpend",
    "Call",
    "CallAttempt",
    "CallStatusRollup",
    "CreditEntry",
    "CreditGrant",
    "CreditOverdraft",
    "Customer",
    "DriftRollup",
    "EntryPlanRates",
    "EntryRates",
    "Event",
    "KeyAssignment",
    "LedgerEntry",
    "MonthArchive",
    "ParkedCall",
    "PlanPrice",
    "PlanVersion",
    "Price",
    "PriceRates",
    "ProviderReportLine",
    "ProviderReportVersion",
    "TokenColumns",
    "UsageRollup",
    "UsageRollupAllKeys",
    "UsageRollupByCustomer",
    "UsageRollupByKey",
    "UsageRollupKeyless",
    "WebhookOutbox",
    "row_dict",
]
