package relay

import (
	"context"
	"testing"
	"time"
)

// Each task runs on its own schedule, in the order given, and a task that says so is not run again.
func TestMaintainRunsEachTaskOnItsSchedule(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var order []string
	stopping, later, ticks := 0, 0, 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		Maintain(ctx,
			Task{Every: time.Millisecond, Run: func(context.Context) bool {
				stopping++
				order = append(order, "stopping")
				return stopping < 3
			}},
			Task{First: time.Hour, Every: time.Millisecond, Run: func(context.Context) bool {
				later++
				return true
			}},
			Task{Every: time.Millisecond, Run: func(context.Context) bool {
				ticks++
				order = append(order, "ticks")
				if ticks == 10 {
					cancel()
				}
				return true
			}},
		)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Maintain did not return after its context ended")
	}
	if stopping != 3 {
		t.Errorf("the task that stops after its third run ran %d times", stopping)
	}
	if later != 0 {
		t.Errorf("the task due in an hour ran %d times", later)
	}
	if ticks != 10 {
		t.Errorf("the ticking task ran %d times, want 10 (it ends the context at the tenth)", ticks)
	}
	if len(order) < 2 || order[0] != "stopping" || order[1] != "ticks" {
		t.Errorf("first runs %v: tasks due together run in the order given", order[:min(len(order), 2)])
	}
}

// With no task left to run, Maintain waits for its context, and returns when it ends.
func TestMaintainWithNothingLeftWaitsForItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		Maintain(ctx, Task{Run: func(context.Context) bool { close(ran); return false }})
	}()
	<-ran
	select {
	case <-done:
		t.Fatal("Maintain returned before its context ended")
	default:
	}
	cancel()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Maintain did not return after its context ended")
	}
}
