package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outboxplugin"
)

// api is the HTTP side of the service.
type api struct {
	db      *gorm.DB
	admin   *outboxplugin.Admin
	healthy func(context.Context) error
	logger  *slog.Logger
}

// handler routes the service's endpoints. The order endpoints and /outbox run in a server span
// each; /healthz and /metrics, polled by machines, are left untraced.
func (a *api) handler(tp trace.TracerProvider, metrics http.Handler) http.Handler {
	traced := http.NewServeMux()
	traced.HandleFunc("POST /orders", a.placeOrder)
	traced.HandleFunc("GET /orders/{id}", a.getOrder)
	traced.HandleFunc("POST /orders/{id}/cancel", a.cancelOrder)
	traced.HandleFunc("GET /outbox", a.outboxStats)

	mux := http.NewServeMux()
	mux.Handle("/", serverSpans(tp, traced))
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.Handle("GET /metrics", metrics)
	return mux
}

// serverSpans runs each request in a span of kind SERVER, continuing the trace of the request's
// traceparent header if it has one. The span is named after the route the mux matched
// ("POST /orders/{id}/cancel"), known only once the mux has routed the request.
func serverSpans(tp trace.TracerProvider, next http.Handler) http.Handler {
	tracer := tp.Tracer(scopeName)
	prop := propagation.TraceContext{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(semconv.HTTPRequestMethodKey.String(r.Method), semconv.URLPath(r.URL.Path)))
		defer span.End()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		r = r.WithContext(ctx)
		next.ServeHTTP(rec, r) // the mux sets r.Pattern on the request it is given
		if r.Pattern != "" {
			span.SetName(r.Pattern)
			if _, route, ok := strings.Cut(r.Pattern, " "); ok {
				span.SetAttributes(semconv.HTTPRoute(route))
			}
		}
		span.SetAttributes(semconv.HTTPResponseStatusCode(rec.status))
		if rec.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(rec.status))
		}
	})
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

// placeOrderRequest is the body of POST /orders.
type placeOrderRequest struct {
	Customer string `json:"customer"`
	Amount   int64  `json:"amount"`
}

// orderEvent is the payload of the OrderPlaced and OrderCancelled events.
type orderEvent struct {
	ID       uint   `json:"id"`
	Customer string `json:"customer"`
	Amount   int64  `json:"amount"`
}

// placeOrder creates an order. The plugin captures the insert as an Order_create event, and the
// handler emits OrderPlaced beside it: the row and both events commit together or not at all. The
// request's context goes to the database call, so the events carry the request's trace context.
func (a *api) placeOrder(w http.ResponseWriter, r *http.Request) {
	var req placeOrderRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		httpError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	if req.Customer = strings.TrimSpace(req.Customer); req.Customer == "" || req.Amount <= 0 {
		httpError(w, http.StatusBadRequest, "customer must be given and amount must be positive")
		return
	}
	order := Order{Customer: req.Customer, Amount: req.Amount, Status: statusPlaced}
	err := a.db.WithContext(r.Context()).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&order).Error; err != nil {
			return err
		}
		return emitOrderEvent(tx, "OrderPlaced", order)
	})
	if err != nil {
		a.serverError(w, r, "place order", err)
		return
	}
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", order.ID))
	writeJSON(w, http.StatusCreated, order)
}

func (a *api) getOrder(w http.ResponseWriter, r *http.Request) {
	id, ok := orderID(w, r)
	if !ok {
		return
	}
	var order Order
	err := a.db.WithContext(r.Context()).First(&order, id).Error
	switch {
	case errors.Is(err, gorm.ErrRecordNotFound):
		httpError(w, http.StatusNotFound, "no such order")
	case err != nil:
		a.serverError(w, r, "get order", err)
	default:
		writeJSON(w, http.StatusOK, order)
	}
}

// errNotPlaced makes cancelOrder's transaction roll back when the order is not in the placed state.
var errNotPlaced = errors.New("order is not placed")

// cancelOrder moves a placed order to cancelled: an update the plugin captures as Order_update, with
// OrderCancelled emitted beside it. The conditional update is the check: of two concurrent cancels
// only one changes the row, and only that one emits.
func (a *api) cancelOrder(w http.ResponseWriter, r *http.Request) {
	id, ok := orderID(w, r)
	if !ok {
		return
	}
	var order Order
	err := a.db.WithContext(r.Context()).Transaction(func(tx *gorm.DB) error {
		res := tx.Model(&Order{}).Where("id = ? AND status = ?", id, statusPlaced).Update("status", statusCancelled)
		if res.Error != nil {
			return res.Error
		}
		if err := tx.First(&order, id).Error; err != nil {
			return err
		}
		if res.RowsAffected == 0 {
			return errNotPlaced
		}
		return emitOrderEvent(tx, "OrderCancelled", order)
	})
	switch {
	case errors.Is(err, gorm.ErrRecordNotFound):
		httpError(w, http.StatusNotFound, "no such order")
	case errors.Is(err, errNotPlaced):
		httpError(w, http.StatusConflict, "order is "+order.Status)
	case err != nil:
		a.serverError(w, r, "cancel order", err)
	default:
		writeJSON(w, http.StatusOK, order)
	}
}

func emitOrderEvent(tx *gorm.DB, eventType string, o Order) error {
	return outboxplugin.Emit(tx, eventType, orderEvent{ID: o.ID, Customer: o.Customer, Amount: o.Amount},
		outboxplugin.WithAggregate("Order", strconv.FormatUint(uint64(o.ID), 10)))
}

// outboxStats shows the outbox's counts: what is still to be published, what is dead, how far
// behind the relay is.
func (a *api) outboxStats(w http.ResponseWriter, r *http.Request) {
	st, err := a.admin.Stats(r.Context())
	if err != nil {
		a.serverError(w, r, "outbox stats", err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (a *api) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := a.healthy(ctx); err != nil {
		httpError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func orderID(w http.ResponseWriter, r *http.Request) (uint, bool) {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 0)
	if err != nil || id == 0 {
		httpError(w, http.StatusBadRequest, "order id must be a positive integer")
		return 0, false
	}
	return uint(id), true
}

func (a *api) serverError(w http.ResponseWriter, r *http.Request, op string, err error) {
	trace.SpanFromContext(r.Context()).RecordError(err)
	a.logger.ErrorContext(r.Context(), op, "error", err)
	httpError(w, http.StatusInternalServerError, op+" failed")
}

func httpError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
