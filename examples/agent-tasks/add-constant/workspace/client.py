import config


def attempts():
    """The attempts a download makes: the first one and MAX_RETRIES more."""
    return 1 + config.MAX_RETRIES


if __name__ == "__main__":
    print("timeout:", config.TIMEOUT_SECONDS, "s; attempts:", attempts())
