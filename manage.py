#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
    from django.core.management import execute_from_command_line

    from studio.data_dir import prepare_data_dir

    prepare_data_dir()
    execute_from_command_line(sys.argv)
