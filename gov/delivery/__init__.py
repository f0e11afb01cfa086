"""Delivery: from an allowed row in gov.outbox to a push service's answer.

``subscription`` parses and checks what a browser sends, ``netguard`` decides which
addresses may be reached, ``vapid`` signs, ``push`` builds and encrypts one request,
``pushclient`` sends it over a keep-alive connection with one deadline, ``runner`` (the
:class:`~gov.delivery.runner.Dispatcher`) claims, sends and records in batches, and
``processes`` runs several runners side by side.
"""
