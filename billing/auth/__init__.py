"""Access control: API tokens with one role each (CONTRACT "Who may do what")."""
