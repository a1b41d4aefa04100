// Package jobs owns the JetStream job runtime: pulling a durable work-queue
// consumer with a fixed number of slots (Run), re-attaching it when lost,
// one job per subject at a time (the subject gate), in-progress reports while
// a job runs or waits, and settling each message from its handler's
// outcome: nil acks, Retry naks with a delay (and gives up with an error
// event after MaxDeliver deliveries), Terminate and Reported terminate,
// shutdown naks (Grace gives running jobs their time after the stop).
// It never decides what a job does or whether a failure is transient: the
// handler says so; it keeps no state beyond one Run and no global state.
package jobs
