"""Elastic runs: the round driver (:mod:`.driver`), host discovery (:mod:`.discovery`)
and the membership records the ranks read (:mod:`.membership`)."""
