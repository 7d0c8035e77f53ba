"""OpenPGP for partners who want their export files encrypted to their public key(s), optionally signed by us.

The real ``gpg`` (GnuPG 2.1 or later) does the OpenPGP, driven through python-gnupg, because it is the
implementation partners decrypt with and it streams: the export is piped through one gpg process, never held
in memory. Three rules shape the package:

* A partner key is checked once, when it is configured (``parse_public_key``): one public key, not revoked,
  not expired, able to encrypt, not too weak. The result (``PartnerKey``) is public and may live in the
  database; ``check_usable`` tells before an export whether it has expired since.
* Our signing key is held by *reference* (``SigningRef``, like ``CredentialRef``): a key file's path, or the
  environment variable that holds that path. Its contents and its path never appear in an exception or a log
  line. No key goes through python-gnupg's ``import_keys``, which logs the first 256 characters of what it
  imports at DEBUG (a secret key's, or whatever was pasted around a public key): imports go down our own pipe.
* gpg runs with a home of our own (``--homedir`` under a private temporary directory), never the user's
  ``~/.gnupg``. Each set of recipients (and signer) gets one home, imported once per process and reused by
  every export to them, so an export costs one gpg process. python-gnupg's ``encrypt_file`` runs gpg to the
  end before it returns and keeps the process to itself, so it cannot be stopped mid-stream; ``Encryptor``
  starts gpg itself (with python-gnupg's command line) and can kill it.

Read in this order:

- ``gpg``: finding the binary, a home of our own (``Home``) and a throwaway one for a single check, and
  gpg's status lines; every other module runs gpg through it.
- ``keys``: ``PartnerKey``, ``parse_public_key`` and ``check_usable``.
- ``signing``: ``SigningRef``, ``parse_signing_ref``, ``check_signing_key``, and loading our signing key into
  a home.
- ``keyrings``: the per-process cache of homes by recipients and signer, and ``forget_keyrings``.
- ``encryptor``: ``Encryptor``, the stream through one gpg process.

The errors (``OpenPGPError``, ``KeyRefused``, ``KeyExpired``, ``EncryptionFailed``) live in
``app.delivery.errors`` with the rest of the delivery tree; they are re-exported here.
"""

from app.delivery.errors import EncryptionFailed, KeyExpired, KeyRefused, OpenPGPError
from app.delivery.openpgp.encryptor import Encryptor
from app.delivery.openpgp.keyrings import forget_keyrings
from app.delivery.openpgp.keys import PartnerKey, check_usable, parse_public_key
from app.delivery.openpgp.signing import SigningRef, check_signing_key, parse_signing_ref

__all__ = [
    "EncryptionFailed",
    "Encryptor",
    "KeyExpired",
    "KeyRefused",
    "OpenPGPError",
    "PartnerKey",
    "SigningRef",
    "check_signing_key",
    "check_usable",
    "forget_keyrings",
    "parse_public_key",
    "parse_signing_ref",
]
