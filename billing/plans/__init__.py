"""Keys, customers and plans (CONTRACT "Keys, customers and plans (v2)"): a key's customer and
plan from a time on, plans versioned with a markup and their own prices, and the charge."""
