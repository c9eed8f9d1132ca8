package server

import (
	"context"

	cheetah "github.com/cheetahbroker/cheetah"
)

// checked runs the edge's checks on an in-process caller's requests too, so
// that what the HTTP API refuses with invalid_request (a NUL in a task id or
// a name, a malformed id, labels out of bounds) is refused the same way in
// process, before it reaches the store, instead of failing there.
type checked struct {
	cheetah.Backend
}

func (c checked) Acquire(ctx context.Context, req cheetah.AcquireRequest) (cheetah.Lease, error) {
	if err := cheetah.CheckTaskID("task_id", req.TaskID); err != nil {
		return cheetah.Lease{}, err
	}
	if err := cheetah.CheckLabels("labels", req.Labels); err != nil {
		return cheetah.Lease{}, err
	}
	return c.Backend.Acquire(ctx, req)
}

func (c checked) Send(ctx context.Context, l cheetah.Lease, cmd cheetah.Command, so cheetah.SendOptions) (cheetah.Sent, error) {
	if err := checkSend(cmd, so); err != nil {
		return cheetah.Sent{}, err
	}
	return c.Backend.Send(ctx, l, cmd, so)
}

func (c checked) SendAndWait(ctx context.Context, l cheetah.Lease, cmd cheetah.Command, so cheetah.SendOptions) (cheetah.Resolution, error) {
	if err := checkSend(cmd, so); err != nil {
		return cheetah.Resolution{}, err
	}
	return c.Backend.SendAndWait(ctx, l, cmd, so)
}

func checkSend(cmd cheetah.Command, so cheetah.SendOptions) error {
	if err := cheetah.CheckText("name", cmd.Name); err != nil {
		return err
	}
	return cheetah.CheckText("response_mode", string(so.ResponseMode))
}

func (c checked) TaskContexts(ctx context.Context, userID, taskID string) ([]cheetah.Lease, error) {
	if err := cheetah.CheckID("user_id", userID); err != nil {
		return nil, err
	}
	// No task id is no task: an empty list, as the registry answers.
	if taskID != "" {
		if err := cheetah.CheckTaskID("task_id", taskID); err != nil {
			return nil, err
		}
	}
	return c.Backend.TaskContexts(ctx, userID, taskID)
}

func (c checked) ReadCommand(ctx context.Context, userID, commandID string) (cheetah.CommandRecord, error) {
	if err := cheetah.CheckID("user_id", userID); err != nil {
		return cheetah.CommandRecord{}, err
	}
	if err := checkCommandID("command_id", commandID); err != nil {
		return cheetah.CommandRecord{}, err
	}
	return c.Backend.ReadCommand(ctx, userID, commandID)
}

func (c checked) ListCommands(ctx context.Context, userID string, q cheetah.ListQuery) (cheetah.CommandPage, error) {
	if q.TaskID != "" {
		if err := cheetah.CheckTaskID("task_id", q.TaskID); err != nil {
			return cheetah.CommandPage{}, err
		}
	}
	if err := cheetah.CheckText("cursor", q.Cursor); err != nil {
		return cheetah.CommandPage{}, err
	}
	return c.Backend.ListCommands(ctx, userID, q)
}
