"""Call log: what operators read about calls, their events and their ledger entries."""
