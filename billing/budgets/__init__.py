"""Budgets, the spend check and alerts (CONTRACT "Budgets and alerts (v2)")."""
