"""The studio works offline: every script and stylesheet a page uses comes from our own static files."""

import re
from pathlib import Path

from django.conf import settings
from django.urls import reverse

TEMPLATES = Path(settings.BASE_DIR) / "templates"


def test_every_asset_a_page_links_is_served_locally(login, owner, project):
    page = login(owner).get(reverse("registry:definition_list", kwargs={"project": project.slug})).content.decode()
    assets = re.findall(r'<(?:script src|link rel="stylesheet" href)="([^"]+)"', page)
    assert any(re.fullmatch(r"/static/vendor/htmx-2\.[\d.]+\.min\.js", a) for a in assets), assets
    assert "/static/css/studio.css" in assets
    client = login(owner)
    for asset in assets:
        response = client.get(asset)
        assert response.status_code == 200, asset
        body = b"".join(response.streaming_content) if response.streaming else response.content
        assert body, asset
        if asset.endswith(".js"):
            assert body.startswith(b"var htmx=")


def test_no_template_or_stylesheet_reaches_for_the_network():
    files = [*TEMPLATES.rglob("*.html"), *(Path(settings.BASE_DIR) / "static" / "css").rglob("*.css")]
    assert len(files) > 5
    remote = [f"{f.relative_to(settings.BASE_DIR)}: {m}" for f in files
              for m in re.findall(r"https?://\S+|//[a-z0-9.-]+\.[a-z]{2,}/", f.read_text())]
    assert remote == []
