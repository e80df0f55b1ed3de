"""Prepaid credits (CONTRACT "Prepaid credits (v3)"): grants, draws, balances."""
