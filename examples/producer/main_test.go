package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestRunValidation(t *testing.T) {
	valid := options{brokers: []string{"127.0.0.1:1"}, topic: "sms", partitions: 1, messages: 1, recipients: 1}
	tests := []struct {
		name   string
		modify func(*options)
		want   string
	}{
		{"no brokers", func(o *options) { o.brokers = nil }, "-brokers"},
		{"no topic", func(o *options) { o.topic = "" }, "-topic"},
		{"no partitions", func(o *options) { o.partitions = 0 }, "-partitions 0"},
		{"negative messages", func(o *options) { o.messages = -1 }, "-messages -1"},
		{"no recipients", func(o *options) { o.recipients = 0 }, "-recipients 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := valid
			tt.modify(&o)
			err := run(context.Background(), o, slog.New(slog.DiscardHandler))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("run = %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

// TestRun loads messages into an in-process broker twice: the first run
// creates the topics, the second appends to them.
func TestRun(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	o := options{brokers: brokers, topic: "sms", dlqTopic: "sms.dlq", partitions: 4, messages: 700, recipients: 50}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 2 {
		if err := run(ctx, o, slog.New(slog.DiscardHandler)); err != nil {
			t.Fatalf("run: %v", err)
		}
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("sms"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	details, err := adm.ListTopics(ctx, "sms", "sms.dlq")
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"sms", "sms.dlq"} {
		if got := len(details[topic].Partitions); got != 4 {
			t.Errorf("topic %s has %d partitions, want 4", topic, got)
		}
	}

	var recs []*kgo.Record
	for len(recs) < 2*o.messages {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d messages: %v", len(recs), 2*o.messages, err)
		}
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	partitionOf := map[string]int32{}
	for _, r := range recs {
		var m sms
		if err := json.Unmarshal(r.Value, &m); err != nil {
			t.Fatalf("message at %d/%d is not JSON: %v", r.Partition, r.Offset, err)
		}
		if m.ID == "" || m.Text == "" || string(r.Key) != m.To {
			t.Fatalf("message %+v with key %q: want an id, a text and the recipient as key", m, r.Key)
		}
		if p, ok := partitionOf[m.To]; ok && p != r.Partition {
			t.Fatalf("recipient %s is in partitions %d and %d; want one", m.To, p, r.Partition)
		}
		partitionOf[m.To] = r.Partition
	}
	if len(partitionOf) != o.recipients {
		t.Errorf("messages go to %d recipients, want %d", len(partitionOf), o.recipients)
	}
}
