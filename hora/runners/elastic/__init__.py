"""Elastic runs: the round driver (:mod:`.driver`; its rounds are the attempts of the one
attempt loop), the relaunch policy of rounds (:mod:`.rounds`), host discovery (:mod:`.discovery`)
and the membership records the ranks read (:mod:`.membership`)."""
