"""Pricing: model prices over time and exact money arithmetic."""
