package rabbitmq

import "time"

// SetDelayRecheck sets how long c's BacklogParts goes without asking for the
// delay queue after the broker said that it does not exist. Call it before
// Run.
func SetDelayRecheck(c *Consumer, d time.Duration) { c.delayProbe.recheck = d }
