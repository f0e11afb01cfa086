"""Security: secrets never leave where they belong (SECURITY.md says what is protected and how)."""
