"""The ground floor: parameters, the output schema, results, time text, intervals,
input forms and the readable reference ATC. Imports nothing else of atc_stream."""
