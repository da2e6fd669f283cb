"""Load predictor: forecasts of pending requests from the five load signals, so the batch
controller can raise its limit before a burst. Pure modules (signals, ewma, evaluate, synth)
import no torch; lstm imports it lazily; runtime is the controller's entry point."""
