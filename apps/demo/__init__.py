"""The demo content: see seed.py (`manage.py seed_demo`)."""
