"""Settings of the download client."""

BASE_URL = "https://example.org/files"
TIMEOUT_SECONDS = 30
