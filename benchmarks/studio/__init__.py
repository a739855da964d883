"""The benchmarks that need the studio: Django set up by `manage.py bench`, the database named by the settings."""
