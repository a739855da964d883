"""Passwords made in the studio, switchable off for everyone but a break-glass account."""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied


class LocalPasswords(ModelBackend):
    """Django's ModelBackend, but with STUDIO_LOCAL_LOGIN=off only STUDIO_BREAK_GLASS_USER may log in with a
    password (the login page, the admin's, any other password form): everyone else logs in through the identity
    provider. Raising PermissionDenied, not returning None, stops Django from asking any later backend."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if not settings.LOCAL_LOGIN and not (settings.BREAK_GLASS_USER and username == settings.BREAK_GLASS_USER):
            raise PermissionDenied("Passwords are switched off here: log in with your identity provider.")
        return super().authenticate(request, username=username, password=password, **kwargs)
