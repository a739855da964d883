"""Logging in (django.contrib.auth's LoginView behind django-axes, studio/settings.py): after 5 wrong passwords
for one user name — or from one address, whatever the names — logging in is refused for 15 minutes, even with
the right password (429 and the locked-out page); a right password does not reset the count (else an attacker's
own log-in would reset the address's). And the
password validators: at least 10 characters, not common, not all digits, not like the user's name."""

import pytest
from django.contrib.auth.password_validation import password_validators_help_texts, validate_password
from django.core.exceptions import ValidationError
from django.test import Client

LOGIN = "/accounts/login/"
RIGHT = "pw-for-tests"  # make_user's password
LIMIT = 5  # AXES_FAILURE_LIMIT's default


@pytest.fixture
def from_address():
    """from_address("10.0.0.1") -> a test client whose requests come from that address."""
    return lambda address: Client(REMOTE_ADDR=address)


def log_in(client, username: str, password: str):
    return client.post(LOGIN, {"username": username, "password": password})


def logged_in(response) -> bool:
    return response.status_code == 302 and response["Location"] == "/"


def locked_out(response) -> bool:
    return response.status_code == 429 and b"Too many failed log-ins" in response.content


def test_a_right_password_logs_in_and_a_wrong_one_is_refused_with_the_form(make_user, from_address):
    make_user("olive")
    client = from_address("10.0.0.1")
    refused = log_in(client, "olive", "wrong")
    assert refused.status_code == 200 and b"Please enter a correct username and password" in refused.content
    assert logged_in(log_in(client, "olive", RIGHT))


def test_five_wrong_passwords_lock_the_user_name_even_for_the_right_password(make_user, from_address):
    make_user("olive")
    client = from_address("10.0.0.1")
    answers = [log_in(client, "olive", f"guess-{n}") for n in range(LIMIT)]
    assert [r.status_code for r in answers[:-1]] == [200] * (LIMIT - 1)
    assert locked_out(answers[-1])  # the fifth wrong one is already refused
    right = log_in(client, "olive", RIGHT)
    assert locked_out(right)
    assert b"after 5 wrong passwords" in right.content and b"15" in right.content
    assert "_auth_user_id" not in client.session
    # The lock is on the name: the right password from another address is refused too ...
    assert locked_out(log_in(from_address("10.0.0.2"), "olive", RIGHT))
    # ... and the first address is locked as well: five failures came from it.
    assert locked_out(log_in(client, "other", RIGHT))


def test_the_user_name_lock_holds_across_addresses(make_user, from_address):
    make_user("olive")
    for n in range(LIMIT):
        log_in(from_address(f"10.0.1.{n}"), "olive", f"guess-{n}")
    assert locked_out(log_in(from_address("10.0.2.1"), "olive", RIGHT))


def test_wrong_passwords_from_one_address_across_user_names_lock_the_address(make_user, from_address):
    for name in ("olive", "pat"):
        make_user(name)
    attacker = from_address("10.0.0.66")
    answers = [log_in(attacker, name, "password123") for name in ("olive", "pat", "quinn", "rory", "sam")]
    assert [r.status_code for r in answers[:-1]] == [200] * (LIMIT - 1) and locked_out(answers[-1])
    assert locked_out(log_in(attacker, "olive", RIGHT))  # a right password from that address is refused
    # Each name saw fewer than five failures: from elsewhere, its owner logs in.
    assert logged_in(log_in(from_address("10.0.0.7"), "olive", RIGHT))


def test_a_forwarded_for_header_does_not_move_the_address(make_user, from_address):
    # Behind no proxy the header is the client's to write: trusting it would give an attacker a fresh address
    # per request.
    make_user("olive")
    attacker = from_address("10.0.0.66")
    for n in range(LIMIT):
        attacker.post(LOGIN, {"username": f"name-{n}", "password": "x"}, HTTP_X_FORWARDED_FOR=f"203.0.113.{n}")
    assert locked_out(attacker.post(LOGIN, {"username": "olive", "password": RIGHT},
                                    HTTP_X_FORWARDED_FOR="203.0.113.200"))


def test_a_right_password_does_not_reset_the_count(make_user, from_address):
    make_user("olive")
    client = from_address("10.0.0.1")
    for n in range(LIMIT - 1):
        assert log_in(client, "olive", f"guess-{n}").status_code == 200
    assert logged_in(log_in(client, "olive", RIGHT))
    client.logout()
    assert locked_out(log_in(client, "olive", "one-more-wrong"))  # the fifth failure within the cool-off


def test_logging_in_to_ones_own_account_does_not_reset_the_failures_against_another_name(make_user,
                                                                                           from_address):
    # An attacker with an account of their own must not get unlimited guesses at someone else's password by
    # logging in to their own account after every four.
    make_user("olive")
    make_user("mallory")
    attacker = from_address("10.0.0.66")
    for n in range(LIMIT - 1):
        log_in(attacker, "olive", f"guess-{n}")
    assert logged_in(log_in(attacker, "mallory", RIGHT))
    attacker.logout()
    assert locked_out(log_in(attacker, "olive", "guess-after-own-log-in"))  # the count went on: five
    assert locked_out(log_in(from_address("10.0.0.7"), "olive", RIGHT))


# --- password validators -------------------------------------------------------------------------------------

def problems(password: str, user=None) -> list[str]:
    try:
        validate_password(password, user=user)
    except ValidationError as error:
        return [e.code for e in error.error_list]
    return []


def test_the_four_validators_are_on():
    texts = " ".join(password_validators_help_texts())
    assert "at least 10 characters" in texts and "commonly used" in texts and "entirely numeric" in texts
    assert "too similar to your other personal information" in texts


def test_weak_passwords_are_rejected(make_user):
    user = make_user("olive-gardener")
    assert {"password_too_common", "password_too_short"} <= set(problems("password"))
    assert {"password_entirely_numeric", "password_too_short"} <= set(problems("1234"))
    assert problems("xK3$vq!2z") == ["password_too_short"]  # 9 characters
    assert "password_too_similar" in problems("olive-gardener1", user=user)
    assert "password_too_common" in problems("password123")
    assert "password_entirely_numeric" in problems("31415926535897")


def test_a_long_random_password_is_accepted(make_user):
    user = make_user("olive-gardener")
    assert problems("vT7#qLm2!xWp9Rz_kE4d", user=user) == []
    assert problems("correct horse battery staple", user=user) == []


def test_behind_a_proxy_each_client_address_is_throttled_on_its_own(make_user, settings):
    """STUDIO_PROXIES=1: the address is the one the proxy adds, so one client's failures lock only that client."""
    settings.PROXIES = 1
    make_user("olive")
    proxy = Client(REMOTE_ADDR="10.0.0.2")
    for n in range(LIMIT):
        proxy.post(LOGIN, {"username": f"name-{n}", "password": "x"}, HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert locked_out(proxy.post(LOGIN, {"username": "olive", "password": RIGHT}, HTTP_X_FORWARDED_FOR="203.0.113.9"))
    assert logged_in(proxy.post(LOGIN, {"username": "olive", "password": RIGHT}, HTTP_X_FORWARDED_FOR="198.51.100.7"))
    # What the client wrote before the proxy's entry is not its address: the proxy's entry is.
    assert locked_out(proxy.post(LOGIN, {"username": "olive", "password": RIGHT},
                                 HTTP_X_FORWARDED_FOR="198.51.100.7, 203.0.113.9"))
