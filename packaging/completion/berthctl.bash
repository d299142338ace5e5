# bash completion for berthctl                              -*- shell-script -*-
_berthctl() {
	local cur prev words cword
	_init_completion || return
	case $cword in
	1)
		COMPREPLY=($(compgen -W 'config status runs send providers sandbox egress container help' -- "$cur"))
		return
		;;
	2)
		case ${words[1]} in
		config) COMPREPLY=($(compgen -W 'check' -- "$cur")) ;;
		runs) COMPREPLY=($(compgen -W 'list show cancel' -- "$cur")) ;;
		send) COMPREPLY=($(compgen -W '--timeout' -- "$cur")) ;;
		providers) COMPREPLY=($(compgen -W 'test' -- "$cur")) ;;
		sandbox | egress) COMPREPLY=($(compgen -W 'explain' -- "$cur")) ;;
		container) COMPREPLY=($(compgen -W 'build status images clean dockerfile rm' -- "$cur")) ;;
		esac
		return
		;;
	esac
	case $prev in
	--config)
		_filedir toml
		return
		;;
	--state)
		COMPREPLY=($(compgen -W 'queued running succeeded failed canceled' -- "$cur"))
		return
		;;
	--method)
		COMPREPLY=($(compgen -W 'GET HEAD POST PUT PATCH DELETE CONNECT' -- "$cur"))
		return
		;;
	esac
	case "${words[1]} ${words[2]}" in
	"config check") COMPREPLY=($(compgen -W '--config --agent' -- "$cur")) ;;
	"runs list") COMPREPLY=($(compgen -W '--state --agent --limit --json' -- "$cur")) ;;
	"runs show" | "sandbox explain" | "container images") COMPREPLY=($(compgen -W '--json' -- "$cur")) ;;
	"egress explain") COMPREPLY=($(compgen -W '--method --json' -- "$cur")) ;;
	"container build") COMPREPLY=($(compgen -W '--agent --no-cache' -- "$cur")) ;;
	"container clean") COMPREPLY=($(compgen -W '--all' -- "$cur")) ;;
	"container dockerfile") COMPREPLY=($(compgen -W '--agent' -- "$cur")) ;;
	esac
} &&
	complete -F _berthctl berthctl
