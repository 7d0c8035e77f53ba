"""The root of every error the application raises on purpose, and the tree that grows from it.

Each error lives beside the code that raises it and derives from ``ExportsError``, so a caller can tell
the application's errors from a library's or a bug, and ``exports`` (``app.cli.common.ERROR_EXITS``)
turns each into an exit code::

    ExportsError                    app/errors.py
        ConfigError (ValueError)    app/config.py            a setting we cannot use: an EXPORTS_* variable,
                                                              the broker URL, a deferral policy, a process's or
                                                              a maintenance service's configuration
        StoreError                  app/store/errors.py      a row count the statement's conditions make impossible
            ChangedUnderLock                                 a row changed while we held its lock
        SchemaTooNew                app/store/migrate.py     the database's schema is newer than this release's
        DestinationError            app/delivery/errors.py   a destination that cannot be used as configured
            InvalidDestination                               a setting out of bounds (port, timeouts, sessions)
                ProfileError                                 a delivery profile that cannot be used
            CredentialError                                  a credential reference malformed or unresolvable
            HostKeyError                                     a host key line unparseable, or not fetchable
            HostKeyMismatch                                  the server presented another key than the pinned one
            SessionLimitReached                              every session slot to the partner is held
            EvidenceNotRecorded                              the baseline could not be appended: no upload
            UploadMismatch                                   the uploaded temporary file is not the expected one
            OpenPGPError                                     OpenPGP unusable (raised itself only when gpg is missing)
                KeyRefused                                   a partner key or our signing key refused when it is set
                KeyExpired                                   a stored partner key expired since it was set
                EncryptionFailed                             gpg failed or was stopped while encrypting
        BuildError                  app/actors/builder.py    the export file was not built
            BuildStopped                                     the stop signal ended the build
            BuildFailed                                      the data, the query or the disk failed it
            BuildInterrupted                                 the database failed transiently on every try
        CronError (ValueError)      app/maintenance/cron.py  a cron expression or time zone APScheduler cannot use
        ClaimUnknown                app/actors/export.py     the claim and its re-read both failed
        SecretError                 app/webhooks/signing.py  a signing secret reference malformed or unresolvable
        InvalidSignature            app/webhooks/signing.py  a webhook request whose signature does not verify
        EvidenceNotAppended         app/actors/runner.py     delivery evidence matched no export row
        CliError                    app/cli/common.py        a command's one-line answer and its exit code
            UsageError                                       the command line itself is wrong (argparse's errors)

Not in the tree, deliberately: an ``AssertionError`` (``assert_never``) for a state the code makes
impossible, which is a bug to fix rather than an answer to give; and the ``ValueError`` of a parser of one
value (``app.metrics.parse_address``, an evidence detail, an enum's value), raised as ``int()`` raises it,
which its caller turns into an answer.

This module is the bottom layer: it imports nothing from the application.
"""


class ExportsError(Exception):
    """Base class of the application's own errors: raised only through one of its subclasses."""
