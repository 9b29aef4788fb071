"""The service: journal, scheduler, resume, local API, notifications, metrics, demo."""
