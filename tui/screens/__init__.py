"""The chat's dialogs: settings, conversations, models."""
