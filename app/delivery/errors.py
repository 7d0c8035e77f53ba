"""The delivery package's own errors, in one tree under ``app.errors.ExportsError``.

They live apart from the modules that raise them because the configuration, the credential and
host-key parsers and the destination all raise them, and a caller (the policy, the CLI) catches
``DestinationError`` without importing the code that delivers.
"""

from app.errors import ExportsError


class DestinationError(ExportsError):
    """Raised when a destination cannot be used as configured: the base of the delivery errors."""


class InvalidDestination(DestinationError):
    """Raised when a destination's settings are out of bounds (a port, an empty remote directory, a
    timeout that is not positive, a session limit): no delivery can be made to it as configured."""


class ProfileError(InvalidDestination):
    """Raised when a delivery profile cannot be used: an unknown column, a bad file name template, a
    delimiter or a time zone that is not one. The message is one line that says what to change."""


class CredentialError(DestinationError):
    """Raised when a credential reference is malformed or cannot be resolved. The message names the
    reference's kind and target at most, never the secret, and never a malformed reference (which
    may be a secret pasted in the wrong place)."""


class HostKeyError(DestinationError):
    """Raised when a pinned host key line cannot be parsed or names another host or port, or when a
    server's host key cannot be fetched."""


class HostKeyMismatch(DestinationError):
    """Raised when a server presents a host key other than the destination's pinned one: a
    configuration error (or an impostor), never a reason to try again later."""


class SessionLimitReached(DestinationError):
    """Raised when every one of a destination's session slots is held (by any worker host): this
    attempt may not open another session to the partner now."""


class EvidenceNotRecorded(DestinationError):
    """Raised when the baseline listing could not be appended as evidence: nothing is uploaded without
    it. The cause is chained."""


class UploadMismatch(DestinationError):
    """Raised when what was uploaded under the temporary name is not the expected file."""


class OpenPGPError(DestinationError):
    """Raised when OpenPGP cannot be used for a destination: the base of the errors below, raised itself
    only when gpg (GnuPG 2.1 or later) cannot be run on this host."""


class KeyRefused(OpenPGPError):
    """Raised when a key given at configuration time cannot be used (a partner's public key, our signing
    key or its reference): one line saying why, never the key text, the key file's path or the reference."""


class KeyExpired(OpenPGPError):
    """Raised when a stored partner key has expired since it was set: an operator must configure the
    partner's current key; trying again later cannot help."""


class EncryptionFailed(OpenPGPError):
    """Raised when gpg failed while encrypting, or was stopped: the message is gpg's status, no secrets.
    The partial output is removed."""
